/* tools/trex/cmd_data_tok.h — the tokenizer and shard subcommands of `trex data` (cmd_data_tok.c).
 * Each takes argv with argv[0] = its own name and returns the exit status (0 ok, 1 failure, 2 usage). */
#ifndef TREX_TOOLS_CMD_DATA_TOK_H
#define TREX_TOOLS_CMD_DATA_TOK_H

int trex_cmd_data_train_tokenizer(int argc, char **argv); /* trex data train-tokenizer */
int trex_cmd_data_tokenize(int argc, char **argv);        /* trex data tokenize */
int trex_cmd_data_encode(int argc, char **argv);          /* trex data encode */
int trex_cmd_data_decode(int argc, char **argv);          /* trex data decode */
int trex_cmd_data_shard_info(int argc, char **argv);      /* trex data shard-info */

#endif
