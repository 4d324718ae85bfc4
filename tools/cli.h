/* cli.h - the pieces of the coda command-line tool that live in their own files. */
#ifndef CODA_CLI_H
#define CODA_CLI_H

#include "coda.h"

/* `coda demo [--device auto|cpu|cuda] [--seed N] [--batch B] [--seq S]`: a
 * small LLaMA layer forward and backward through the epilogue programs on the
 * best backend (auto: CUDA if present, else the CPU), checked
 * against the unfused reference. argv: the arguments after "demo". Parses
 * them before making a context (so --help and bad usage touch no device).
 * Prints a table; returns 0 if every output is within tolerance (or after
 * --help / -h, which print coda_cli_demo_usage on stdout), 1 if one is not or
 * a call failed, 2 on bad usage (message and usage on stderr). */
int coda_cli_demo(int argc, char **argv);

/* The demo's usage text (`coda demo --help`, `coda help demo`). */
extern const char coda_cli_demo_usage[];

/* *out = s as a whole decimal integer in lo..hi; 0 (and *out unchanged)
 * when s is empty, not a number, or outside the range. */
int coda_cli_parse_int(const char *s, long long lo, long long hi, long long *out);

/* `coda train [options]`: a byte-level LLaMA trained on a text file with
 * the split block on the CPU backend (tools/cli_train.c). Returns 0 when
 * the loss fell, 1 if it did not or a call failed, 2 on bad usage. */
int coda_cli_train(int argc, char **argv);
extern const char coda_cli_train_usage[];

#endif
