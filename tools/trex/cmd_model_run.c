/* tools/trex/cmd_model_run.c — placeholder while the real command is being written (not for landing). */
#include "commands.h"

int trex_cmd_model_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return trex_cli_error("'trex model run' is not built yet");
}
