/* Fuzz target: the daemon's configuration file, YAML read through the opt
 * mechanism (`rlorch serve --config FILE`: config_load, opt_parse, libyaml's
 * event parser, every field's conversion and range, the checks across
 * fields).
 *
 * The input is the file. A file that loads must print (config_print) as YAML
 * that loads again to the same configuration, as --print-config promises; a
 * file that does not load is refused with a message naming where. Paths in the
 * file (token_file, tls_*, prompts_file) are opened as the daemon would open
 * them; run the harness with stdin on /dev/null. */
#include "fuzz_util.h"

#include "orchestrator/daemon/config.h"

static fuzz_file in, again;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_file_init(&in, "rlorch.yaml");
  fuzz_file_init(&again, "printed.yaml");
  return 0;
}

/* Loads path as `rlorch serve --config path` with an empty environment. */
static int load(config *c, const char *path, char *err, size_t len) {
  char *argv[] = {"serve", "--config", (char *)path, NULL};
  char *envp[] = {NULL};
  return config_load(c, 3, argv, envp, err, len);
}

static char *printed(const config *c, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  FUZZ_CHECK(f, "open_memstream");
  config_print(c, f);
  fclose(f);
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_file_set(&in, data, size);
  config c;
  char err[1200] = "";
  int rc = load(&c, in.path, err, sizeof err);
  if (rc != 0) {
    FUZZ_CHECK(rc == -1, "rc %d", rc);
    FUZZ_CHECK(!strncmp(err, "rlorch serve: ", 14) && strlen(err) > 14, "no origin: '%s'", err);
    config_free(&c);
    return 0;
  }
  size_t n1 = 0, n2 = 0;
  char *p1 = printed(&c, &n1);
  fuzz_file_set(&again, p1, n1);
  config c2;
  rc = load(&c2, again.path, err, sizeof err);
  FUZZ_CHECK(rc == 0, "printed configuration does not load: %s\n%s", err, p1);
  char *p2 = printed(&c2, &n2);
  FUZZ_CHECK(n1 == n2 && !memcmp(p1, p2, n1), "printed configuration loads differently:\n%s\n%s",
             p1, p2);
  free(p1);
  free(p2);
  config_free(&c2);
  config_free(&c);
  return 0;
}
