/* harness.h - the test harness shared by every test program (header only).
 *
 *   CHECK(cond, fmt, ...)     count a check; print and remember a failure
 *   CHECK_OK(call)            the call returns CODA_OK
 *   CHECK_STATUS(call, st)    the call returns status st (bad-input tests)
 *   rng_*                     deterministic random data (never zeros)
 *   rel_err_*                 ||out - ref|| / ||ref|| against float64
 *   TEST_MAIN_END()           print the summary, exit 1 on any failure
 *
 * Tests may exit(); the library never does. */
#ifndef CODA_TEST_HARNESS_H
#define CODA_TEST_HARNESS_H

#include "coda.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int h_checks __attribute__((unused)), h_failures __attribute__((unused));

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        h_checks++;                                                        \
        if (!(cond)) {                                                     \
            h_failures++;                                                  \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

#define CHECK_OK(call)                                                          \
    do {                                                                        \
        coda_status_t h_s = (call);                                             \
        CHECK(h_s == CODA_OK, "%s -> %s: %s", #call, coda_status_name(h_s),     \
              coda_last_error());                                               \
    } while (0)

#define CHECK_STATUS(call, want)                                                 \
    do {                                                                         \
        coda_status_t h_s = (call);                                              \
        CHECK(h_s == (want), "%s -> %s (want %s): %s", #call, coda_status_name(h_s), \
              coda_status_name(want), coda_last_error());                        \
        CHECK(h_s == CODA_OK || coda_last_error()[0] != 0, "%s: empty error message", #call); \
    } while (0)

/* Exit at once if a setup step fails (nothing after it can be meaningful). */
#define REQUIRE_OK(call)                                                         \
    do {                                                                         \
        coda_status_t h_s = (call);                                              \
        if (h_s != CODA_OK) {                                                    \
            fprintf(stderr, "FATAL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, \
                    coda_status_name(h_s), coda_last_error());                   \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#define TEST_MAIN_END()                                                         \
    do {                                                                        \
        printf("%s: %d checks, %d failures\n", __FILE__, h_checks, h_failures); \
        return h_failures ? 1 : 0;                                              \
    } while (0)

/* A whole text file (malloc'd, NUL-terminated), or NULL. */
static inline char *h_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
        if (fread(buf, 1, (size_t)n, f) == (size_t)n) buf[n] = 0;
        else free(buf), buf = NULL;
    }
    fclose(f);
    return buf;
}

/* The program files of a comma-separated list (CODA_BENCH_FILES) appended
 * to names[] (the file's name) and texts[] from *n on, up to cap: 0, or
 * the index of the list's first unreadable file + 1 (reported on stderr). */
static inline int h_program_files(const char *list, const char **names, const char **texts, int *n, int cap) {
    int idx = 0;
    for (const char *f = list; f && *f && *n < cap; idx++) {
        size_t len = strcspn(f, ",");
        char path[512];
        snprintf(path, sizeof path, "%.*s", (int)len, f);
        char *text = h_read_text(path);
        if (!text) {
            fprintf(stderr, "cannot read program file %s\n", path);
            return idx + 1;
        }
        const char *base = strrchr(path, '/');
        names[*n] = strdup(base ? base + 1 : path);
        texts[(*n)++] = text;
        f += len + (f[len] == ',');
    }
    return 0;
}

static inline void *h_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* ---- random data: xorshift64*, uniform in [-scale, scale), never all zero ---- */
typedef struct { uint64_t s; } h_rng;
static inline h_rng rng_new(uint64_t seed) { h_rng r = {seed * 0x9E3779B97F4A7C15ull + 1}; return r; }
static inline uint64_t rng_next(h_rng *r) {
    r->s ^= r->s >> 12; r->s ^= r->s << 25; r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}
static inline float rng_uniform(h_rng *r) {
    return (float)((rng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
/* n random bytes, the first never zero (so never all zeros) */
static inline void rng_fill_bytes(h_rng *r, unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(rng_next(r) >> 56);
    if (n) p[0] |= 1;
}
static inline uint16_t h_f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float h_bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline void rng_fill_bf16(h_rng *r, uint16_t *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = h_f2bf(rng_uniform(r) * scale);
}
static inline void rng_fill_f32(h_rng *r, float *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = rng_uniform(r) * scale;
}
/* NaN poison, so that unwritten outputs show. */
static inline void poison_bf16(uint16_t *p, int64_t n) { for (int64_t i = 0; i < n; i++) p[i] = 0x7fc1; }
static inline void poison_f32(float *p, int64_t n) { for (int64_t i = 0; i < n; i++) p[i] = NAN; }

/* ||out - ref|| / ||ref|| (ref in float64); NaN anywhere in out gives INFINITY. */
static inline double rel_err_f32(const float *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(out[i])) return INFINITY;
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static inline double rel_err_bf16(const uint16_t *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        float o = h_bf2f(out[i]);
        if (isnan(o)) return INFINITY;
        double d = (double)o - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
/* The tolerance rule (docs/testing.md): within twice the plain bf16 error. */
static inline int within_tol(double err, double baseline_err) { return err <= 2.0 * baseline_err + 1e-6; }

#endif
