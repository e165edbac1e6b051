/* tools/trex/cmd_plan.c — placeholder while the real command is being written (not for landing). */
#include "commands.h"

int trex_cmd_plan(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return trex_cli_error("'trex plan' is not built yet");
}
