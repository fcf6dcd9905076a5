"""The output-head and divergence kernels: below both the methods (losses) and the engines
(scoring), so neither reaches into the other for them.

- `heads`: the chunked output head (logprobs, logsumexp, top-k per chunk of positions, with its
  own autograd), never a [tokens, vocab] tensor;
- `states`: final hidden states without the head, and what is computed from them (CE, logprobs);
- `jsd`: the full-vocabulary generalised JSD over checkpointed chunks;
- `losses`: the OPD loss family's per-token forms on the chunked head's outputs.
"""
