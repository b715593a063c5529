"""Moved: the cost model is `engine.decoding.cost_model`, adaptive K `engine.decoding.adaptive_k`, the n-gram
drafter `engine.decoding.drafters.ngram`. This name stays while callers move."""

from engine.decoding.adaptive_k import *  # noqa: F403
from engine.decoding.adaptive_k import match_bucket as _bucket  # noqa: F401
from engine.decoding.cost_model import *  # noqa: F403
from engine.decoding.drafters.ngram import *  # noqa: F403
