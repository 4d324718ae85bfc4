/* status.c - status names and the per-thread last-error message. */
#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

const char *coda_status_name(coda_status_t status) {
    switch (status) {
    case CODA_OK: return "CODA_OK";
    case CODA_ERR_INVALID_ARG: return "CODA_ERR_INVALID_ARG";
    case CODA_ERR_SHAPE: return "CODA_ERR_SHAPE";
    case CODA_ERR_STRIDE: return "CODA_ERR_STRIDE";
    case CODA_ERR_DTYPE: return "CODA_ERR_DTYPE";
    case CODA_ERR_OVERLAP: return "CODA_ERR_OVERLAP";
    case CODA_ERR_DEVICE: return "CODA_ERR_DEVICE";
    case CODA_ERR_PARSE: return "CODA_ERR_PARSE";
    case CODA_ERR_VERIFY: return "CODA_ERR_VERIFY";
    case CODA_ERR_BINDING: return "CODA_ERR_BINDING";
    case CODA_ERR_COMPILE: return "CODA_ERR_COMPILE";
    case CODA_ERR_NO_MEMORY: return "CODA_ERR_NO_MEMORY";
    case CODA_ERR_UNSUPPORTED: return "CODA_ERR_UNSUPPORTED";
    case CODA_ERR_INTERNAL: return "CODA_ERR_INTERNAL";
    }
    return "CODA_ERR_UNKNOWN";
}

const char *coda_last_error(void) { return last_error; }

coda_status_t coda__fail(coda_status_t status, const char *fmt, ...) {
    /* formatted aside first: an argument may be coda_last_error() itself
     * (a caller adding its own context to a callee's message) */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return status;
}

void coda__error_keep(coda__error_kept_t *k) {
    _Static_assert(sizeof k->msg == sizeof last_error, "the kept message must hold the whole message");
    memcpy(k->msg, last_error, sizeof last_error);
}

void coda__error_restore(const coda__error_kept_t *k) { memcpy(last_error, k->msg, sizeof last_error); }
