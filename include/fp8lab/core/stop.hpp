// The process's request to stop long work at its next safe point: a trainer ends its run
// after the step with a checkpoint, a sweep starts no more runs. What a SIGINT handler calls
// (async-signal-safe); the program, not the library, installs the handler.
#pragma once

namespace fp8lab {

void request_stop();
bool stop_requested();
void clear_stop_request();

}  // namespace fp8lab
