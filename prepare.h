// prepare.h: `./train prepare`, text to llm.c token shards (byte-level, GPT-2's BPE, or a BPE it learns).
#ifndef LLM4D_PREPARE_H
#define LLM4D_PREPARE_H

// argv[0] is the first argument after "prepare"; returns the exit status (errors die with one line).
int prepare_main(int argc, char **argv);

#endif
