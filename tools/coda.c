/* coda.c - the command-line tool.
 *
 *   coda info               build options and devices found
 *   coda check [--cpu] FILE verify an epilogue program; print it back or its errors
 *   coda programs           list the built-in programs of the LLaMA layer
 *   coda show NAME          print a built-in program
 *   coda demo [options]     a small LLaMA layer forward and backward, checked
 *   coda train [options]    train a small byte-level LLaMA on a text file (CPU)
 *   coda version            print the version
 *   coda help [COMMAND]     usage; `coda COMMAND --help` (or -h) too
 *
 * Exit status, for every command:
 *   0  success; also --help / -h, which print the usage on stdout.
 *   1  a failed check or run:
 *        check: FILE cannot be opened or read, is a directory, is larger than
 *               CODA_CLI_MAX_PROGRAM_BYTES (1 MiB) or contains a NUL byte; the
 *               program does not parse or verify; or it has more arguments
 *               than the CUDA backend takes (CODA_EPI_MAX_ARGS, 16) and
 *               --cpu was not given
 *        show:  no built-in program of that name
 *        demo:  an output is out of tolerance, or a call failed
 *        train: the data cannot be read, a call failed, or the loss did not fall
 *        info:  no context could be created
 *        any:   writing the output failed (e.g. a full disk)
 *   2  bad usage: unknown command or option, a missing or extra argument, a
 *      bad option value. The message and the usage go to stderr. */
#include "coda.h"
#include "cli.h"
/* CODA_EPI_MAX_ARGS: the code generator's limit is the CUDA backend's, so
 * `check` warns with the very constant the backend refuses programs by. */
#include "codegen/codegen.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The largest program file `coda check` reads. A program is at most 64
 * arguments and 1024 instructions (src/program/ir.h): a few KB, some tens
 * with long comments. A wrong FILE (/dev/zero, a log, a binary) is refused
 * after at most this many bytes + 1, instead of being read until memory runs
 * out. */
#define CODA_CLI_MAX_PROGRAM_KIB 1024
#define CODA_CLI_MAX_PROGRAM_BYTES (CODA_CLI_MAX_PROGRAM_KIB * 1024)

/* Numbers in the usage texts come from the constants themselves. */
#define STR_(x) #x
#define STR(x) STR_(x)

typedef struct command {
    const char *name;
    const char *usage;               /* printed by --help, and on bad usage */
    int (*run)(int argc, char **argv); /* argv: the arguments after the name */
} command_t;

static const command_t *find_command(const char *name);

static const char main_usage[] =
    "usage: coda <command> [args]\n"
    "  info                build options and devices found\n"
    "  check [--cpu] FILE  verify an epilogue program (FILE '-' reads stdin)\n"
    "  programs            list the built-in programs of the LLaMA layer\n"
    "  show NAME           print a built-in program\n"
    "  demo [options]      a small LLaMA layer forward+backward, checked against\n"
    "                      the unfused reference (GPU if present, else CPU)\n"
    "  version             print the version\n"
    "  train [options]     train a small byte-level LLaMA on a text file (GPU if\n"
    "                      present, else CPU), printing the loss and tokens per second\n"
    "  help [COMMAND]      this text, or a command's (also: coda COMMAND --help)\n"
    "exit status: 0 success, 1 failed check or run, 2 bad usage\n";

/* Bad usage: what was wrong ("coda CMD: ..."), then the usage, on stderr;
 * exit status 2. */
static int usage_error(const char *cmd, const char *usage, const char *fmt, ...) CODA_PRINTF(3, 4);
static int usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "coda%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fputs(usage, stderr);
    return 2;
}

static int is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

/* The argument parsing every command but demo shares: -h/--help, the flags
 * in `flags` (NULL-terminated; flag i sets bit i of *set), "--" ending the
 * options, and exactly n_operands operands (their names in `operand`, for
 * messages). "-" alone is an operand (stdin). Returns -1 to go on, else the
 * exit status (0 after --help). */
static int parse_args(const command_t *c, int argc, char **argv, const char *const *flags,
                      unsigned *set, int n_operands, const char *operand, char **operands) {
    int n = 0, options_done = 0;
    if (set) *set = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && a[0] == '-' && a[1]) {
            if (is_help(a)) {
                fputs(c->usage, stdout);
                return 0;
            }
            if (!strcmp(a, "--")) {
                options_done = 1;
                continue;
            }
            int known = 0;
            for (int f = 0; flags && flags[f]; f++)
                if (!strcmp(a, flags[f])) {
                    *set |= 1u << f;
                    known = 1;
                }
            if (!known) return usage_error(c->name, c->usage, "unknown option '%s'", a);
            continue;
        }
        if (n == n_operands) return usage_error(c->name, c->usage, "unexpected argument '%s'", a);
        operands[n++] = argv[i];
    }
    if (n < n_operands) return usage_error(c->name, c->usage, "missing %s", operand);
    return -1;
}

/* The whole of FILE (or stdin) as a NUL-terminated heap string; NULL (and a
 * message on stderr) if it cannot be read, is a directory, is larger than
 * CODA_CLI_MAX_PROGRAM_BYTES, or holds a NUL byte (which would hide
 * everything after it from the parser). read(2) rather than stdio, so that
 * no more than the limit + 1 bytes are ever read (stdio reads ahead). */
static char *read_program(const char *path, const char *shown) {
    int fd = strcmp(path, "-") == 0 ? STDIN_FILENO : open(path, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "coda: cannot open %s: %s\n", shown, strerror(errno));
        return NULL;
    }
    /* A directory opens fine and only fails at the first read (EISDIR):
     * say what it is instead. */
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "coda: %s is a directory, not a program file\n", shown);
        if (fd != STDIN_FILENO) close(fd);
        return NULL;
    }
    const size_t limit = CODA_CLI_MAX_PROGRAM_BYTES;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    int err = 0;
    while (buf && len <= limit) {
        if (len + 1 == cap) { /* keep one byte for the terminating NUL */
            size_t grown_cap = cap * 2 > limit + 2 ? limit + 2 : cap * 2;
            char *grown = realloc(buf, grown_cap);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap = grown_cap;
        }
        /* never ask for more than limit + 1 bytes in all: one past the limit
         * is enough to know the file is too large */
        size_t want = cap - len - 1;
        if (want > limit + 1 - len) want = limit + 1 - len;
        ssize_t n = read(fd, buf + len, want);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) err = errno;
        if (n <= 0) break;
        len += (size_t)n;
    }
    if (fd != STDIN_FILENO) close(fd);
    if (!buf) {
        fprintf(stderr, "coda: out of memory reading %s\n", shown);
        return NULL;
    }
    const char *why = NULL;
    char msg[160];
    if (err) {
        snprintf(msg, sizeof msg, "read error: %s", strerror(err));
        why = msg;
    } else if (len > limit) {
        snprintf(msg, sizeof msg, "too large: more than %d bytes (%d KiB), the limit for a program file",
                 CODA_CLI_MAX_PROGRAM_BYTES, CODA_CLI_MAX_PROGRAM_KIB);
        why = msg;
    } else if (memchr(buf, 0, len)) {
        why = "contains a NUL byte";
    }
    if (why) {
        fprintf(stderr, "coda: %s: %s\n", shown, why);
        free(buf);
        return NULL;
    }
    buf[len] = 0;
    return buf;
}

static int print_program(const coda_program_t *p) {
    size_t len = 0;
    coda_program_print(p, NULL, 0, &len);
    char *text = malloc(len + 1);
    if (!text) {
        fprintf(stderr, "coda: out of memory printing the program\n");
        return 1;
    }
    coda_status_t s = coda_program_print(p, text, len + 1, NULL);
    if (s == CODA_OK) fputs(text, stdout);
    else fprintf(stderr, "coda: print failed: %s\n", coda_last_error());
    free(text);
    return s == CODA_OK ? 0 : 1;
}

static const char check_usage[] =
    "usage: coda check [--cpu] FILE\n"
    "  Parse and verify the epilogue program in FILE ('-' reads stdin; at most\n"
    "  " STR(CODA_CLI_MAX_PROGRAM_KIB) " KiB). Prints it back on stdout, or its errors on stderr.\n"
    "  A program with more arguments than the CUDA backend takes (" STR(CODA_EPI_MAX_ARGS) ") runs\n"
    "  on the CPU backend only, and fails the check unless\n"
    "  --cpu  the program is meant for the CPU backend: accept it (a note on\n"
    "         stderr still says so)\n"
    "exit status: 0 valid; 1 invalid, unreadable, or CPU-only without --cpu;\n"
    "2 bad usage\n";

static int cmd_check(int argc, char **argv) {
    static const char *const flags[] = {"--cpu", NULL};
    unsigned set;
    char *path;
    int rc = parse_args(find_command("check"), argc, argv, flags, &set, 1, "FILE", &path);
    if (rc >= 0) return rc;
    const int cpu_ok = set & 1u;
    const char *shown = strcmp(path, "-") == 0 ? "stdin" : path;
    char *text = read_program(path, shown);
    if (!text) return 1;
    coda_program_t *p = NULL;
    coda_status_t s = coda_program_parse(text, &p);
    free(text);
    if (s != CODA_OK) {
        fprintf(stderr, "%s:%s (%s)\n", shown, coda_last_error(), coda_status_name(s));
        return 1;
    }
    /* The verifier takes up to 64 arguments, the GPU code generator 16: a
     * program in between passes the verifier and is only refused when it
     * first runs on the GPU. Say so now; it is a failed check unless the
     * user says the CPU backend is the target. */
    int n_args = coda_program_num_args(p);
    if (n_args > CODA_EPI_MAX_ARGS) {
        fprintf(stderr,
                "%s: %s: %d arguments: the CUDA backend takes at most %d; this program runs on "
                "the CPU backend only%s\n",
                shown, cpu_ok ? "note" : "error", n_args, CODA_EPI_MAX_ARGS,
                cpu_ok ? "" : " (--cpu accepts it)");
        if (!cpu_ok) {
            coda_program_free(p);
            return 1;
        }
    }
    rc = print_program(p);
    coda_program_free(p);
    return rc;
}

static const char show_usage[] =
    "usage: coda show NAME\n"
    "  Print the built-in program NAME (see 'coda programs').\n"
    "exit status: 0 printed, 1 no such program, 2 bad usage\n";

static int cmd_show(int argc, char **argv) {
    char *name;
    int rc = parse_args(find_command("show"), argc, argv, NULL, NULL, 1, "NAME", &name);
    if (rc >= 0) return rc;
    const char *text = coda_builtin_program(name);
    if (!text) {
        fprintf(stderr, "coda: no built-in program '%s' (see 'coda programs')\n", name);
        return 1;
    }
    fputs(text, stdout);
    return 0;
}

static const char programs_usage[] =
    "usage: coda programs\n"
    "  List the built-in programs of the LLaMA layer, one name a line.\n";

static int cmd_programs(int argc, char **argv) {
    int rc = parse_args(find_command("programs"), argc, argv, NULL, NULL, 0, NULL, NULL);
    if (rc >= 0) return rc;
    for (const char *const *n = coda_builtin_program_names(); *n; n++) puts(*n);
    return 0;
}

static const char info_usage[] =
    "usage: coda info\n"
    "  Print the build options and the devices found.\n"
    "exit status: 0 printed, 1 no context could be created, 2 bad usage\n";

static int cmd_info(int argc, char **argv) {
    int rc = parse_args(find_command("info"), argc, argv, NULL, NULL, 0, NULL, NULL);
    if (rc >= 0) return rc;
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

static const char version_usage[] = "usage: coda version\n  Print the version.\n";

static int cmd_version(int argc, char **argv) {
    int rc = parse_args(find_command("version"), argc, argv, NULL, NULL, 0, NULL, NULL);
    if (rc >= 0) return rc;
    printf("coda %s\n", CODA_VERSION_STRING);
    return 0;
}

static const char help_usage[] =
    "usage: coda help [COMMAND]\n"
    "  Print the usage of coda, or of COMMAND.\n";

static int cmd_help(int argc, char **argv) {
    char *name = NULL;
    if (argc == 0) {
        fputs(main_usage, stdout);
        return 0;
    }
    int rc = parse_args(find_command("help"), argc, argv, NULL, NULL, 1, "COMMAND", &name);
    if (rc >= 0) return rc;
    const command_t *c = find_command(name);
    if (!c) return usage_error("help", main_usage, "unknown command '%s'", name);
    fputs(c->usage, stdout);
    return 0;
}

static const command_t commands[] = {
    {"info", info_usage, cmd_info},
    {"check", check_usage, cmd_check},
    {"programs", programs_usage, cmd_programs},
    {"show", show_usage, cmd_show},
    {"demo", coda_cli_demo_usage, coda_cli_demo},
    {"train", coda_cli_train_usage, coda_cli_train},
    {"version", version_usage, cmd_version},
    {"help", help_usage, cmd_help},
};

static const command_t *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs("coda: missing command\n", stderr);
        fputs(main_usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    const command_t *c = find_command(cmd);
    if (is_help(cmd)) c = find_command("help");
    if (!strcmp(cmd, "--version")) c = find_command("version");
    if (!c) return usage_error(NULL, main_usage, "unknown command '%s'", cmd);
    int rc = c->run(argc - 2, argv + 2);
    /* A full disk or a closed pipe must not pass for success: stdout's
     * errors only show once its buffer is flushed. */
    int err = fflush(stdout) != 0 ? errno : 0;
    if (err || ferror(stdout)) {
        fprintf(stderr, "coda: error writing the output: %s\n", err ? strerror(err) : "write failed");
        if (rc == 0) rc = 1;
    }
    return rc;
}
