"""Moved: the n-gram drafter is `engine.decoding.drafters.ngram`. This name stays while callers move."""

from engine.decoding.drafters.ngram import *  # noqa: F403
from engine.decoding.drafters.ngram import _bucket  # noqa: F401
