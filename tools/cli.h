/* cli.h - the pieces of the coda command-line tool that live in their own files. */
#ifndef CODA_CLI_H
#define CODA_CLI_H

#include "coda.h"

/* `coda demo [--device auto|cpu|cuda] [--seed N] [--batch B] [--seq S]`: a
 * small LLaMA layer forward and backward through the epilogue programs on the
 * best backend (auto: CUDA if present, else the CPU), checked
 * against the unfused reference. Prints a table; returns 0 if every output
 * is within tolerance, 1 if one is not or a call failed, 2 on bad usage. */
int coda_cli_demo(coda_context_t *ctx, int argc, char **argv);

#endif
