/* The load options' shared spelling: the one reader of sizes (Python's parse_bytes and edgellm-run call it), so
 * that "600MB" means the same bytes everywhere. */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../edgellm.h"
#include "el_internal.h"

static const struct { const char* unit; double bytes; } UNITS[] = {
    {"", 1},       {"b", 1},
    {"k", 1024.0}, {"kb", 1e3},  {"kib", 1024.0},
    {"m", 1048576.0}, {"mb", 1e6}, {"mib", 1048576.0},
    {"g", 1073741824.0}, {"gb", 1e9}, {"gib", 1073741824.0},
    {"t", 1099511627776.0}, {"tb", 1e12}, {"tib", 1099511627776.0},
};

int el_parse_bytes(const char* s, uint64_t* out) {
  if (!s) return el_error("no size given: give bytes or a size like 600MB or 2GiB");
  const char* p = s;
  while (isspace((unsigned char)*p)) p++;
  /* a plain decimal number (digits, at most one '.', a digit after it; no sign, exponent, hex or inf), then a unit */
  const char* num = p;
  int digits = 0, frac = 0;
  for (; isdigit((unsigned char)*p) || (*p == '.' && !frac); p++) {
    if (*p == '.') frac = 1, digits = 0;
    else digits++;
  }
  if (!digits) return el_error("'%s' is not a size: give bytes or a size like 600MB or 2GiB", s);
  while (isspace((unsigned char)*p)) p++;
  const char* u = p;
  while (isalpha((unsigned char)*p)) p++;
  size_t ulen = (size_t)(p - u);
  while (isspace((unsigned char)*p)) p++;
  double mult = 0;
  for (size_t i = 0; i < sizeof UNITS / sizeof *UNITS; i++)
    if (strlen(UNITS[i].unit) == ulen && !strncasecmp(UNITS[i].unit, u, ulen)) mult = UNITS[i].bytes;
  if (*p || !mult) return el_error("'%s' is not a size: give bytes or a size like 600MB or 2GiB", s);
  /* strtod stops where the number ends (no unit starts with e or x): the double Python's float() gives, times the
   * unit, truncated like int() */
  double n = floor(strtod(num, NULL) * mult);
  if (!(n > 0)) return el_error("'%s' is out of range: it must be more than 0 bytes", s);
  if (n > 4611686018427387904.0) return el_error("'%s' is out of range: at most 4 EiB (2^62 bytes)", s);
  *out = (uint64_t)n;
  return 0;
}
