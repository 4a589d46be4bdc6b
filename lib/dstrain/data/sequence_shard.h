#pragma once
// Sequence parallelism's share of a batch (parallel.sequence_parallel_size): the S ranks of a
// sequence group read the same rows, and each keeps T / S consecutive tokens of every row.
#include "dstrain/data/batch.h"

namespace dstrain::data {

struct SequenceShare {
  int rank = 0;       // which T / S tokens: [rank T/S, (rank + 1) T/S)
  int size = 1;       // S
  int lookahead = 0;  // multi-token prediction's depth D: the columns after the share it reads
};

// Rank `share.rank`'s columns of tokens, labels, positions (always given: their values are the
// whole row's) and target_weights, with trained_targets counted in them; document_ids and
// document_lengths stay the whole rows' (attention's scope is the whole sequence). A row length
// that S does not divide is padded at the end with tokens that train nothing and that no earlier
// token sees (their own document). samples (per_sample's units) stay on rank 0 only, so the
// group counts each once. With a lookahead D, the D columns after the share go to ahead_tokens,
// ahead_labels and ahead_weights (Batch). The batch itself when S is 1.
Batch sequence_shard(const Batch& batch, SequenceShare share);

}  // namespace dstrain::data
