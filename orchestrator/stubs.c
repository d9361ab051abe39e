/* Subcommands that later work fills in. Each says so and exits 2; nothing pretends.
 * Remove an entry here when its real implementation lands. */
#include <stdio.h>

#include "orchestrator/commands.h"

static int not_yet(const char *name) {
  fprintf(stderr, "rlorch %s: not implemented yet\n", name);
  return 2;
}



int cmd_trainer(int argc, char **argv) { (void)argc; (void)argv; return not_yet("trainer"); }
int cmd_inference(int argc, char **argv) { (void)argc; (void)argv; return not_yet("inference"); }


