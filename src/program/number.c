/* number.c - const numbers in text, the same in every locale.
 *
 * strtof and printf follow LC_NUMERIC: a host program that sets, say, a
 * German locale would make "0.5" stop parsing and the printer write "0,5".
 * The text form always uses '.', so both go through the "C" locale. */
#include "program/program.h"

#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static locale_t c_locale; /* (locale_t)0 if newlocale failed: plain calls then */
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void) { c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

float coda__strtof(const char *s, char **end) {
    pthread_once(&c_locale_once, make_c_locale);
    if (c_locale) return strtof_l(s, end, c_locale);
    return strtof(s, end);
}

int coda__format_float(char *buf, size_t cap, float f) {
    pthread_once(&c_locale_once, make_c_locale);
    if (!c_locale) return snprintf(buf, cap, "%.9g", (double)f);
    locale_t old = uselocale(c_locale); /* this thread only */
    int n = snprintf(buf, cap, "%.9g", (double)f);
    uselocale(old);
    return n;
}
