/* tools/trex/cmd_data.c — placeholder while the real command is being written (not for landing). */
#include "commands.h"

int trex_cmd_data(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return trex_cli_error("'trex data' is not built yet");
}
