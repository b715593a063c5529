"""The speculative core, backend-free: the round loop, the sampler, the drafters, acceptance accounting.

`round_loop` runs one reply (draft K, verify once, accept a prefix) over any model that gives next-token logits;
`sampling` is the one sampler every path shares; `drafting` holds the n-gram drafter, the verify-cost model and the
adaptive K; `acceptance` counts rounds and holds the formulas (alpha, predicted speedup); `rates` defines a reply's
speed; `draft_compat` says whether a draft can draft for its target. Nothing here imports a backend.
"""
