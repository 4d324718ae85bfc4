/* coda.c - the command-line tool.
 *
 *   coda info          build options and devices found
 *   coda check FILE    verify an epilogue program; print it back or its errors
 *   coda programs      list the built-in programs of the LLaMA layer
 *   coda show NAME     print a built-in program
 *   coda demo [...]    a small LLaMA layer forward and backward, checked
 *
 * Exit status: 0 on success, 1 on a failed check, 2 on bad usage. */
#include "coda.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *f) {
    fprintf(f,
            "usage: coda <command> [args]\n"
            "  info          build options and devices found\n"
            "  check FILE    verify an epilogue program (FILE '-' reads stdin)\n"
            "  programs      list the built-in programs of the LLaMA layer\n"
            "  show NAME     print a built-in program\n"
            "  demo          a small LLaMA layer forward+backward, checked against\n"
            "                the unfused reference (GPU if present, else CPU)\n"
            "  version       print the version\n");
    return f == stderr ? 2 : 0;
}

/* Whole file (or stdin) into a NUL-terminated heap string; NULL (and a
 * message on stderr) on a read error or a NUL byte inside the text, which
 * would otherwise hide everything after it from the parser. */
static char *read_all(const char *path) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "coda: cannot open %s\n", path);
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) break;
        if (len + 1 == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    int bad_read = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf) {
        fprintf(stderr, "coda: out of memory reading %s\n", path);
        return NULL;
    }
    buf[len] = 0;
    if (bad_read || strlen(buf) != len) {
        fprintf(stderr, "coda: %s: %s\n", path, bad_read ? "read error" : "contains a NUL byte");
        free(buf);
        return NULL;
    }
    return buf;
}

static int print_program(const coda_program_t *p) {
    size_t len = 0;
    coda_program_print(p, NULL, 0, &len);
    char *text = malloc(len + 1);
    if (!text) return 1;
    coda_status_t s = coda_program_print(p, text, len + 1, NULL);
    if (s == CODA_OK) fputs(text, stdout);
    else fprintf(stderr, "coda: print failed: %s\n", coda_last_error());
    free(text);
    return s == CODA_OK ? 0 : 1;
}

static int cmd_check(const char *path) {
    char *text = read_all(path);
    if (!text) return 1;
    coda_program_t *p = NULL;
    coda_status_t s = coda_program_parse(text, &p);
    free(text);
    if (s != CODA_OK) {
        fprintf(stderr, "%s:%s (%s)\n", path, coda_last_error(), coda_status_name(s));
        return 1;
    }
    int rc = print_program(p);
    coda_program_free(p);
    return rc;
}

static int cmd_show(const char *name) {
    const char *text = coda_builtin_program(name);
    if (!text) {
        fprintf(stderr, "coda: no built-in program '%s' (see 'coda programs')\n", name);
        return 1;
    }
    fputs(text, stdout);
    return 0;
}

static int cmd_info(void) {
    coda_context_t *ctx = NULL;
    if (coda_context_create(NULL, &ctx) != CODA_OK) {
        fprintf(stderr, "coda: %s\n", coda_last_error());
        return 1;
    }
    char buf[4096];
    coda_status_t s = coda_context_describe(ctx, buf, sizeof buf);
    fputs(buf, stdout);
    if (s != CODA_OK) printf("(describe: %s)\n", coda_last_error());
    coda_context_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "-h") || !strcmp(cmd, "--help")) return usage(stdout);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("coda %s\n", CODA_VERSION_STRING);
        return 0;
    }
    if (!strcmp(cmd, "info")) return cmd_info();
    if (!strcmp(cmd, "check")) return argc == 3 ? cmd_check(argv[2]) : usage(stderr);
    if (!strcmp(cmd, "show")) return argc == 3 ? cmd_show(argv[2]) : usage(stderr);
    if (!strcmp(cmd, "programs")) {
        for (const char *const *n = coda_builtin_program_names(); *n; n++) puts(*n);
        return 0;
    }
    if (!strcmp(cmd, "demo")) {
        coda_context_t *ctx = NULL;
        if (coda_context_create(NULL, &ctx) != CODA_OK) {
            fprintf(stderr, "coda: %s\n", coda_last_error());
            return 1;
        }
        int rc = coda_cli_demo(ctx, argc - 2, argv + 2);
        coda_context_free(ctx);
        return rc;
    }
    fprintf(stderr, "coda: unknown command '%s'\n", cmd);
    return usage(stderr);
}
