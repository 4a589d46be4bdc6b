#pragma once
// `dstrain generate TARGET` and `dstrain chat TARGET` (tasks/generation_session.h holds what they
// share). generate: prompts are plain text (tokenized as transformers' tokenizer(TEXT)) or
// conversations ({"messages": [...]}, rendered with the model's chat template and its generation
// prompt), run in batches, left-padded, with the key/value cache; prints each prompt's text
// (streamed on a terminal) or one JSON object per prompt. chat: a conversation on a terminal.
#include "dstrain/tasks/generation_session.h"

namespace dstrain::tasks {

// Returns the exit status. Errors name the flag, or the prompts file's line.
int run_generate(const GenerateRequest& request);

// The interactive loop: each line the user types is a user message, the model's answer is streamed
// and kept in the history; /reset forgets the history, /system TEXT sets the system message (and
// starts again), Ctrl-D leaves. save_path: the session's conversations are written there (JSON
// Lines {"messages": [...]}) after every answer. Refused (exit 2) when stdin is not a terminal.
int run_chat(const GenerateRequest& request, const std::string& save_path);

}  // namespace dstrain::tasks
