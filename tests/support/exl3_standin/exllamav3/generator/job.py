"""Stand-in for exllamav3/generator/job.py (1.6.5): the Job API, scripted.

- `Job(input_ids, max_new_tokens=None, min_new_tokens=0, max_skips=4, sampler=None, seed=None, stop_conditions=None,
  decode_special_tokens=False, ..., **kwargs)` (lines 54-77): `sampler=None` is `DefaultSampler()` (not neutral);
  live counters `accepted_draft_tokens` / `rejected_draft_tokens` and `draft_stats` (lines 276-280).
- `prepare_for_queue` (lines 1264-1293): `max_new_tokens` is clamped, silently, to the cache's room past the prompt
  less 1 and `max_draft_tokens`.
- `receive_sample` (lines 781-1190): every token is held first; a stop token ends the job with what was held (and the
  stop token) in `result["held"]` (emit_held False); `max_new_tokens` ends it exactly at the limit, releasing what was
  held (line 997); an incomplete UTF-8 character and a possible stop-string start stay held; the end result carries
  `new_tokens`, `prompt_tokens`, `time_*`, `cached_pages`/`cached_tokens`, and the draft counters where a drafter is
  on (lines 925-946).
"""

from __future__ import annotations

import time

import torch

from exllamav3.constants import PAGE_SIZE
from exllamav3.generator.sampler import DefaultSampler


class Job:
    def __init__(
        self,
        input_ids,
        max_new_tokens: int | None = None,
        min_new_tokens: int = 0,
        max_skips: int | None = 4,
        sampler=None,
        seed: int = None,
        stop_conditions=None,
        decode_special_tokens: bool = False,
        return_top_tokens: int = 0,
        return_logits: bool = False,
        return_probs: bool = False,
        filters=None,
        token_healing: bool = False,
        identifier=None,
        banned_strings=None,
        embeddings=None,
        max_rq_tokens: int | None = None,
        stop_on_loop=None,
        rq_state=None,
        **kwargs,
    ):
        if not isinstance(input_ids, list):
            input_ids = [input_ids]
        assert input_ids[0].shape[-1] > 0, "Input IDs cannot be empty."
        assert max_new_tokens is None or max_new_tokens >= 1, (
            "max_new_tokens must be >= 1, or None for no limit"
        )
        self.input_ids = input_ids[0]
        self.sequence = input_ids[0][0].tolist()
        self.max_new_tokens = max_new_tokens
        self.sampler = sampler if sampler is not None else DefaultSampler()
        self.seed = seed
        self.decode_special_tokens = decode_special_tokens
        self.stop_tokens = set()
        self.stop_strings = set()
        for t in stop_conditions or []:
            if isinstance(t, int):
                self.stop_tokens.add(t)
            elif isinstance(t, str):
                self.stop_strings.add(t)
            else:
                raise ValueError("Unsupported type in stop_conditions")
        self.new_tokens = 0
        self.generator = None
        self.serial_number = None
        self.time_enqueue = None
        self.time_first_prefill = None
        self.time_first_token = None
        self.time_last_token = None
        self.accepted_draft_tokens = 0
        self.rejected_draft_tokens = 0
        self.draft_stats = []
        self.cached_pages = 0
        self.cached_tokens = 0
        self.is_finished = False
        self.prefill_done = False
        self.standin_round = 0

    # --- the scripted target -------------------------------------------------------------------------

    def standin_target_token(self, position: int) -> int:
        script = self.generator.model.config.standin
        reply = script.get("reply") or [self.generator.tokenizer.eos_token_id]
        end = script.get("end", "eos")
        if position < len(reply):
            return reply[position]
        if end == "none":
            return reply[position % len(reply)]
        if end == "end_of_turn":
            return self.generator.tokenizer.single_id("<|im_end|>")
        return self.generator.tokenizer.eos_token_id

    # --- queue, pages, prefill -------------------------------------------------------------------------

    def prepare_for_queue(self, generator, serial_number: int, rq: bool = False):
        self.serial_number = serial_number
        self.generator = generator
        room = generator.max_total_tokens - len(self.sequence) - 1 - generator.max_draft_tokens
        if self.max_new_tokens is None:
            self.max_new_tokens = max(1, room)
        elif room >= 1:
            self.max_new_tokens = min(self.max_new_tokens, room)
        total_pages = (len(self.sequence) + self.max_new_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        assert total_pages <= generator.max_total_tokens // PAGE_SIZE, (
            f"Job requires {total_pages} pages (only {generator.max_total_tokens // PAGE_SIZE} available) "
            "and cannot be enqueued."
        )
        self.held_text = ""
        self.held_tokens = []
        self.full_completion = ""
        self.time_enqueue = time.time()

    def is_prefill_done(self):
        return self.prefill_done

    def allocate_pages(self):
        prompt = self.sequence[:-1]
        best = 0
        for seq in self.generator.standin_cached_sequences:
            n = 0
            for a, b in zip(seq, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self.cached_pages = best // PAGE_SIZE
        self.cached_tokens = best - self.cached_pages * PAGE_SIZE

    def deallocate_pages(self):
        self.generator.standin_cached_sequences.append(list(self.sequence))

    def prefill(self, results):
        if self.prefill_done:
            return
        if self.time_first_prefill is None:
            self.time_first_prefill = time.time()
        self.prefill_done = True
        results.append({
            "job": self, "stage": "prefill", "eos": False, "serial": self.serial_number,
            "curr_progress": len(self.sequence) - 1, "max_progress": len(self.sequence) - 1,
        })  # fmt: skip

    # --- sampling and streaming (as receive_sample in the real file) ---------------------------------

    def receive_sample(self, next_token, results) -> bool:
        self.new_tokens += 1
        token = next_token.item()
        self.sequence.append(token)
        gen = self.generator

        def emit(emit_eos=False, eos_reason=None, emit_held=False, stop_token=None, stop_string=None,
                 rem_held_text=None):  # fmt: skip
            r = {"job": self, "stage": "streaming", "eos": emit_eos, "serial": self.serial_number}
            if eos_reason is not None:
                r["eos_reason"] = eos_reason
                if eos_reason == "stop_token":
                    r["eos_triggering_token_id"] = stop_token
                    r["eos_triggering_token_str"] = gen.tokenizer.get_id_to_piece_list(True)[stop_token]
                if eos_reason == "stop_string":
                    r["eos_triggering_string"] = stop_string
            if emit_held:
                if self.held_text != "":
                    self.full_completion += self.held_text
                    r["text"] = self.held_text
                    self.held_text = ""
                if self.held_tokens:
                    r["token_ids"] = torch.tensor([self.held_tokens], dtype=torch.long)
                    self.held_tokens = []
            if emit_eos:
                self.is_finished = True
                self.time_last_token = time.time()
                r.update({
                    "full_completion": self.full_completion,
                    "new_tokens": self.new_tokens,
                    "prompt_tokens": len(self.input_ids[0]),
                    "time_enqueued": self.time_first_prefill - self.time_enqueue,
                    "time_prefill": self.time_first_token - self.time_first_prefill,
                    "time_generate": self.time_last_token - self.time_first_token,
                    "cached_pages": self.cached_pages,
                    "cached_tokens": self.cached_pages * PAGE_SIZE + self.cached_tokens,
                })  # fmt: skip
                if gen.draft_model or gen.ngram_match_min or gen.hybrid_draft_tokens:
                    r["accepted_draft_tokens"] = self.accepted_draft_tokens
                    r["rejected_draft_tokens"] = self.rejected_draft_tokens
                if eos_reason == "stop_string":
                    self.held_text = rem_held_text
                rh = {}
                if self.held_text:
                    rh["text"] = self.held_text
                if self.held_tokens:
                    rh["token_ids"] = torch.tensor([self.held_tokens], dtype=torch.long)
                if rh:
                    r["held"] = rh
            results.append(r)
            return emit_eos

        self.held_text += gen.tokenizer.get_id_to_piece_list(self.decode_special_tokens)[token]
        self.held_tokens.append(token)

        if token in self.stop_tokens:
            return emit(emit_eos=True, eos_reason="stop_token", stop_token=token)
        if self.new_tokens >= self.max_new_tokens:
            return emit(emit_eos=True, emit_held=True, eos_reason="max_new_tokens")

        if 1 <= self.held_text.count("\ufffd") < 5:
            test_decode = gen.tokenizer.decode(
                torch.tensor(self.held_tokens, dtype=torch.long),
                decode_special_tokens=self.decode_special_tokens,
            )
            if "\ufffd" not in test_decode:
                self.held_text = test_decode
            else:
                return emit()

        if self.stop_strings:
            for s in self.stop_strings:
                at = self.held_text.find(s)
                if at >= 0:
                    held = self.held_text[at:]
                    self.held_text = self.held_text[:at]
                    return emit(emit_eos=True, emit_held=True, eos_reason="stop_string", stop_string=s,
                                rem_held_text=held)  # fmt: skip
            if any(self.held_text.endswith(s[:n]) for s in self.stop_strings for n in range(1, len(s))):
                return emit()

        return emit(emit_held=True)
