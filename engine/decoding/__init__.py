"""The speculative core, backend-free: the round loop, the sampler, the drafters, acceptance accounting.

`round_loop` runs one reply (draft K, verify once, accept a prefix) over any model that gives next-token logits,
asking the drafters it is given (`drafters/`: one per file behind one interface, and the name map every list of
drafter names reads); `cost_model` prices a verify pass and a round of drafts, `adaptive_k` picks the K that pays;
`sampling` is the one sampler every path shares; `acceptance` counts rounds and holds the formulas (alpha,
predicted speedup); `verdict` says whether drafting can pay here; `rates` defines a reply's speed; `draft_compat`
says whether a draft can draft for its target. Nothing here imports a backend.
"""
