#pragma once
// Which send a receive waits for, and back: RF s.i receives what SF (s-1).i sent, RB s.i what
// SB (s+1).i sent. The one statement of the rule for the transfers' placement, the replay and
// the validator (peers left -1).
#include "dstrain/pipeline/schedule.h"

namespace dstrain::pipeline {

inline Action matching_send(const Action& receive) {
  return receive.op == Op::kRecvForward ? Action{Op::kSendForward, receive.stage - 1, receive.micro_batch, -1}
                                        : Action{Op::kSendBackward, receive.stage + 1, receive.micro_batch, -1};
}

// The receive of `send` on the peer, from rank `from`.
inline Action matching_receive(const Action& send, int from) {
  return send.op == Op::kSendForward ? Action{Op::kRecvForward, send.stage + 1, send.micro_batch, from}
                                     : Action{Op::kRecvBackward, send.stage - 1, send.micro_batch, from};
}

inline bool is_send(Op op) { return op == Op::kSendForward || op == Op::kSendBackward; }
inline bool is_receive(Op op) { return op == Op::kRecvForward || op == Op::kRecvBackward; }

}  // namespace dstrain::pipeline
