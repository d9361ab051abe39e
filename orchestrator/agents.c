/* `rlorch trainer` and `rlorch inference`: the worker agents (workers/agent). */
#include "orchestrator/commands.h"
#include "workers/agent/agent.h"

int cmd_trainer(int argc, char **argv) { return agent_trainer_main(argc, argv); }
int cmd_inference(int argc, char **argv) { return agent_inference_main(argc, argv); }
