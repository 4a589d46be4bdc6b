#pragma once
// One micro-batch as the training step consumes it: what the model reads (tokens and each
// token's position), what the loss trains (labels, kIgnoreIndex where nothing is trained), where
// documents begin and end inside each row, and how many targets count. Pretraining builds it
// from T + 1-token windows (pretraining_batch); fine-tuning and evaluation build their own, and
// the step runners (train/step_runner.h) and the objective (model/objective.h) take any of them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dstrain::data {

constexpr int64_t kIgnoreIndex = -100;  // a label that trains nothing (Hugging Face's convention)

struct Batch {
  at::Tensor tokens;     // int64 [B, T]: the model's inputs
  at::Tensor labels;     // int64 [B, T]: position t's target, kIgnoreIndex where none is trained
  at::Tensor positions;  // int64 [B, T]: each token's position (RoPE)
  // Each row's documents, in order, as token counts that sum to T (one per row when documents
  // are not cut), and each token's document index within its row (int64 [B, T]; undefined when
  // documents are not cut: attention is plainly causal).
  std::vector<std::vector<int64_t>> document_lengths;
  at::Tensor document_ids;
  int64_t trained_targets = 0;  // labels that are not kIgnoreIndex
  // train.loss_normalization per_sample (weigh_per_sample): each target's weight, 1 / its sample's
  // trained targets (float32 [B, T]; undefined: every target weighs 1), and the samples that train.
  at::Tensor target_weights;
  int64_t samples = 0;
  // Training: the first row's place in the global sample order (the others follow); keys what is
  // random per row (LoRA's dropout). -1: an evaluation batch.
  int64_t first_row = -1;
  bool sequential_positions = true;  // positions are 0..T-1 in every row (the models' fast path)
  // Preference pairs (data/preference_pairs.h): rows 2i and 2i + 1 are pair i's chosen and
  // rejected sequences; `pairs` of them are real (the rest, from `end` on, train nothing), and
  // the reference model's log-prob sum of each row's completion (float64 [rows]; undefined until
  // the reference pass has made them).
  int64_t pairs = 0;
  at::Tensor reference_logps;
  // The step's (an evaluation: the set's) chosen-completion targets over its pairs, the same on
  // every rank: what turns a token mean over the step into a sum over pairs (preference.loss_type
  // sft). 0: not counted.
  double chosen_targets_per_pair = 0;
  // A reward model's batch (train.objective reward): where each row's score is read, its last
  // token that is not the pad token (data/score_token.h; int64 [rows], 0 in rows that train
  // nothing; undefined for other objectives).
  at::Tensor score_positions;
  // A reward model's pairs' margins (float32 [pairs], TRL's "margin" column: the loss is
  // -logsigmoid(chosen - rejected - margin)); undefined when the set has none.
  at::Tensor margins;
  // An unpaired (KTO) batch (data/kto_set.h): rows 2i and 2i + 1 are example i and its KL
  // sequence (its prompt with another example's completion), and example i's label: whether its
  // completion is desirable (bool [pairs]; undefined for other batches).
  at::Tensor desirable;

  // Sequence parallelism (data/sequence_shard.h): the whole rows' trained targets and samples, the
  // units that weigh a rank's part of the auxiliary losses; -1: the batch is not a share.
  int64_t whole_trained_targets = -1, whole_samples = -1;
  // ... this share's first column in the whole rows, and for multi-token prediction the D columns
  // after the share (the next rank's first ones; past the row's end: token 0, label kIgnoreIndex,
  // weight 0): int64 [B, D] tokens and labels, float32 [B, D] weights (with target_weights).
  int64_t sequence_begin = 0;
  at::Tensor ahead_tokens, ahead_labels, ahead_weights;

  int64_t rows() const { return tokens.size(0); }
  int64_t length() const { return tokens.size(1); }
  // The same batch with its tensors on `device` (the host-side facts are copied; sequential
  // positions, which the models never read, stay where they are).
  Batch to(const c10::Device& device) const;
};

// Pretraining's batch from windows int64 [B, T + 1]: tokens are the first T, labels the last T
// (every target trained). eos >= 0 cuts documents after each `eos` token (the end-of-document
// token belongs to the document it ends): document_lengths; mask_documents then gives the
// document ids (attention within documents, data.document_mask) and restart_positions counts
// positions from 0 in each document (data.reset_positions, Megatron's reset_position_ids);
// otherwise positions run 0..T-1 through the row.
Batch pretraining_batch(const at::Tensor& windows, int64_t eos = -1, bool mask_documents = false, bool restart_positions = false);
// Weighs every sample (each document of each row, document_lengths) equally: target_weights and
// samples, from the labels. A sample without a trained target is not counted.
void weigh_per_sample(Batch& batch);

// The trained targets of a preference batch's real chosen rows (0 for other batches).
int64_t chosen_targets(const Batch& batch);

// A batch of given tokens and labels (int64 [B, T], kIgnoreIndex where nothing is trained):
// positions 0..T-1, documents not cut.
Batch labelled_batch(const at::Tensor& tokens, const at::Tensor& labels);

}  // namespace dstrain::data
