"""Stand-in for exllamav2.generator.dynamic (0.3.2): the generator and job API, scripted instead of computed.

Follows the real file where the backend can observe it: constructor arguments and assertions, `draft_ids_pinned`
of shape (max_batch_size, num_draft_tokens), one streaming result per sampled token with the same keys, live
`accepted_draft_tokens` / `rejected_draft_tokens`, the stop at `max_new_tokens - num_draft_tokens`, stop tokens
that are not emitted, `cancel(job)`, and prefix reuse (`cached_tokens`) across jobs.

Held text, as `ExLlamaV2DynamicJob.receive_sample` in 0.3.2 (lines ~2005-2241): every sampled token goes into
`held_text` / `held_tokens` first; a stop token ends the job with both still held (`result["held"]`, the stop token
last); an incomplete UTF-8 character (1 to 4 U+FFFD in the held text that a decode of the held tokens does not
resolve) and text ending in the start of a stop string are held (a streaming result with neither "text" nor
"token_ids"); a full stop string ends the job with every held token in "token_ids", the text before it in "text"
and the stop string onwards in `result["held"]["text"]`. `partial_strings_match` is the extension's C function.
"""

from __future__ import annotations

import threading
import time

import torch

from exllamav2.cache import ExLlamaV2Cache_8bit
from exllamav2.generator.sampler import ExLlamaV2Sampler

PAGED_PAGE_SIZE = 256


class ExLlamaV2DynamicGenerator:
    def __init__(
        self,
        model,
        cache,
        tokenizer,
        max_batch_size=None,
        max_seq_len=None,
        max_chunk_size=None,
        max_q_size=8,
        draft_model=None,
        draft_cache=None,
        num_draft_tokens=4,
        use_ngram_draft=False,
        max_ngram=4,
        max_sampling_threads=16,
        min_sampling_threads=3,
        paged=True,
        filter_background_eval=True,
        **kwargs,
    ):
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        cfg = self.model.config
        self.padded_vocab_size = ((cfg.vocab_size + 31) // 32) * 32
        self.draft_model = draft_model
        self.draft_cache = draft_cache

        if draft_model or use_ngram_draft:
            assert num_draft_tokens <= max_q_size, "num_draft_tokens cannot be larger than max_q_size."
            self.num_draft_tokens = num_draft_tokens
        else:
            self.num_draft_tokens = 0

        if draft_model:
            assert draft_cache is not None, "Must supply cache for draft model"
            assert (
                draft_cache.max_seq_len == cache.max_seq_len and draft_cache.batch_size == cache.batch_size
            ), "Cache and draft cache must be same dimensions"
            assert draft_model.config.max_seq_len >= model.config.max_seq_len, (
                "Draft model seq len must be >= model seq len"
            )

        if paged:
            from exllamav2.attn import assert_paged_attn

            assert_paged_attn()
            assert not cfg.no_flash_attn, (
                "Paged mode requires flash-attn, but flash-attn is disabled in model config."
            )

        assert not isinstance(cache, ExLlamaV2Cache_8bit), (
            "Dynamic generator does not currently work with 8-bit cache. Use either FP16 or Q4."
        )

        if not max_batch_size:
            max_batch_size = cfg.max_input_len // max_q_size
            self.max_batch_size = max_batch_size
        else:
            model_max_q = cfg.max_batch_size * cfg.max_input_len
            req_max_q = max_q_size * max_batch_size
            assert req_max_q <= model_max_q, "generator requires max_batch_size * max_q_size too large"
            self.max_batch_size = max_batch_size

        if max_seq_len is not None:
            assert max_seq_len <= model.config.max_seq_len
            self.max_seq_len = max_seq_len
        else:
            self.max_seq_len = model.config.max_seq_len

        self.paged = paged
        self.page_size = PAGED_PAGE_SIZE if paged else self.cache.max_seq_len
        assert cache.batch_size == 1, "DynamicGenerator requires cache to have batch_size = 1"
        assert self.cache.max_seq_len % PAGED_PAGE_SIZE == 0, (
            f"cache.max_seq_len must be multiple of {PAGED_PAGE_SIZE}, received {cache.max_seq_len}"
        )
        self.max_pages = max(cache.max_seq_len // self.page_size, 1)
        self.max_total_tokens = cache.max_seq_len
        self.reset_page_table()
        self.max_chunk_size = max_chunk_size if max_chunk_size is not None else model.config.max_input_len

        self.job_serial = 0
        self.pending_jobs = []
        self.active_jobs = []

        self.logits_pinned = torch.empty(
            (max_batch_size, max_q_size, self.padded_vocab_size), dtype=torch.float
        )
        if draft_model:
            self.draft_input_ids_pinned = torch.empty((max_batch_size, 1), dtype=torch.long)
            self.draft_ids_pinned = torch.empty((max_batch_size, num_draft_tokens), dtype=torch.long)
        if use_ngram_draft:
            assert draft_model is None, "Cannot use both draft model and ngram draft"
        self.max_ngram = max_ngram
        self.use_ngram_draft = use_ngram_draft
        self.current_loras = None
        self.sampling_pool = None
        self.filter_pool = None
        self.standin_iterate_thread = None
        self.standin_jobs = []  # every job enqueued, for tests to inspect

    def reset_page_table(self):
        # The stand-in's "pages": token sequences whose keys/values a finished or cancelled job left behind.
        self.standin_cached_sequences = []

    def num_remaining_jobs(self):
        return len(self.pending_jobs) + len(self.active_jobs)

    def clear_queue(self):
        for job in self.active_jobs + self.pending_jobs:
            job.deallocate_pages()
        self.active_jobs.clear()
        self.pending_jobs.clear()

    def enqueue(self, job):
        if isinstance(job, list):
            return [self.enqueue(j) for j in job]
        job.prepare_for_queue(self, self.job_serial)
        self.standin_jobs.append(job)
        self.job_serial += 1
        self.pending_jobs.append(job)
        job.time_enqueue = time.time()
        return job.serial_number

    def cancel(self, job):
        # Real exllamav2 does not check this but corrupts its page table when it is broken.
        assert self.standin_iterate_thread in (None, threading.get_ident()), (
            "cancel() must be called from the thread that runs iterate()"
        )
        if job in self.pending_jobs:
            self.pending_jobs.remove(job)
        elif job in self.active_jobs:
            job.deallocate_pages()
            self.active_jobs.remove(job)

    def iterate(self) -> list[dict]:
        self.standin_iterate_thread = threading.get_ident()
        results = []
        for job in self.pending_jobs.copy():
            if len(self.active_jobs) >= self.max_batch_size:
                break
            self.pending_jobs.remove(job)
            self.active_jobs.append(job)
            job.allocate_pages()
            results.append({"job": job, "stage": "started", "eos": False, "serial": job.serial_number})
        for job in self.active_jobs:
            job.prefill(results)
        if self.draft_model:
            assert self.draft_ids_pinned.shape == (self.max_batch_size, self.num_draft_tokens), (
                "stand-in: draft_ids_pinned must be resized with num_draft_tokens (the real generator misbehaves)"
            )
            draft_tokens = self.iterate_scripted_drafts(
                self.draft_model.config.standin.get("draft_acceptance", [1])
            )
            self.iterate_gen(results, draft_tokens)
        elif self.use_ngram_draft:
            draft_tokens = self.iterate_scripted_drafts(
                self.model.config.standin.get("ngram_acceptance", [1])
            )
            self.iterate_gen(results, draft_tokens)
        else:
            self.iterate_gen(results)
        return results

    def iterate_scripted_drafts(self, schedule):
        """K drafts per job: the target's next a_r tokens, then wrong ones (round r of the schedule)."""
        rows = []
        for job in self.active_jobs:
            if not job.is_prefill_done():
                continue
            accept = schedule[job.standin_round % len(schedule)] if schedule else 0
            ids = []
            for i in range(self.num_draft_tokens):
                right = job.standin_target_token(job.new_tokens + i)
                ids.append(right if i < accept else (right + 1) % self.tokenizer.get_vocab_size())
            rows.append(ids)
        if not rows:
            return None
        if self.draft_model:
            for b, ids in enumerate(rows):
                for i, t in enumerate(ids):
                    self.draft_ids_pinned[b, i] = t
            return self.draft_ids_pinned
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), self.num_draft_tokens)

    def iterate_gen(self, results, draft_tokens=None):
        completed_jobs = []
        j = 0
        for job in self.active_jobs:
            if not job.is_prefill_done():
                continue
            if job.time_first_token is None:
                job.time_first_token = time.time()
            q = 1 + (draft_tokens.shape[-1] if draft_tokens is not None else 0)
            assert q <= self.logits_pinned.shape[1], "logits buffer is max_q_size wide: K + 1 must fit"
            job.standin_round += 1
            for i in range(q):
                token = job.standin_target_token(job.new_tokens)
                job.standin_samples.append((job.new_tokens, job.gen_settings.temperature, job.gen_settings))
                eos = job.receive_sample(torch.tensor([[token]], dtype=torch.long), results)
                if eos:
                    completed_jobs.append(job)
                    break
                if draft_tokens is not None and i < q - 1:
                    if draft_tokens[j, i].item() != token:
                        job.rejected_draft_tokens += q - 1 - i
                        break
                    job.accepted_draft_tokens += 1
            j += 1
        for job in completed_jobs:
            job.deallocate_pages()
            self.active_jobs.remove(job)


class ExLlamaV2DynamicJob:
    def __init__(
        self,
        input_ids,
        max_new_tokens,
        min_new_tokens=0,
        max_skips=4,
        gen_settings=None,
        seed=None,
        stop_conditions=None,
        decode_special_tokens=False,
        return_top_tokens=0,
        return_logits=False,
        return_probs=False,
        filters=None,
        filter_prefer_eos=False,
        token_healing=False,
        identifier=None,
        banned_strings=None,
        embeddings=None,
        **kwargs,
    ):
        if not isinstance(input_ids, list):
            input_ids = [input_ids]
        assert all(ids.device.type == "cpu" for ids in input_ids), "input_ids must reside in system memory"
        assert input_ids[0].shape[-1] > 0, "Input IDs cannot be empty."
        assert input_ids[0].shape[0] == 1, (
            "input_ids must be [1, seq_len] tensor or list of [1, seq_len] tensors"
        )
        self.generator = None
        self.serial_number = None
        self.identifier = identifier
        self.input_ids = input_ids[0]
        self.sequence = input_ids[0][0].tolist()
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.new_tokens = 0
        self.gen_settings = gen_settings if gen_settings is not None else ExLlamaV2Sampler.Settings()
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
        self.time_enqueue = None
        self.time_first_prefill = None
        self.time_first_token = None
        self.time_last_token = None
        self.accepted_draft_tokens = 0
        self.rejected_draft_tokens = 0
        self.cached_pages = 0
        self.cached_tokens = 0
        self.is_finished = False
        self.prefill_done = False
        self.standin_round = 0
        self.standin_samples = []

    def __repr__(self):
        return (
            "ExLlamaV2DynamicJob (new)"
            if self.serial_number is None
            else f"ExLlamaV2DynamicJob #{self.serial_number}"
        )

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

    def prepare_for_queue(self, generator, serial_number):
        self.serial_number = serial_number
        self.generator = generator
        page_size = generator.page_size
        max_len = len(self.sequence) + self.max_new_tokens
        total_pages = (max_len + page_size - 1) // page_size
        assert total_pages <= generator.max_pages, (
            f"Job requires {total_pages} pages (only {generator.max_pages} available) and cannot be enqueued."
        )
        self.held_text = ""
        self.held_tokens = []
        self.full_completion = ""

    def is_prefill_done(self):
        return self.prefill_done

    def allocate_pages(self):
        gen = self.generator
        prompt = self.sequence[:-1]
        best = 0
        candidates = gen.standin_cached_sequences if gen.paged else gen.standin_cached_sequences[-1:]
        for seq in candidates:
            n = 0
            for a, b in zip(seq, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        if gen.paged:
            self.cached_pages = best // gen.page_size
            partial = best - self.cached_pages * gen.page_size
            self.cached_tokens = partial if partial > 1 else 0
        else:
            self.cached_tokens = best

    def deallocate_pages(self):
        self.generator.standin_cached_sequences.append(list(self.sequence))

    def prefill(self, results):
        if self.prefill_done:
            return
        if self.time_first_prefill is None:
            self.time_first_prefill = time.time()
        self.prefill_done = True
        results.append(
            {
                "job": self,
                "stage": "prefill",
                "eos": False,
                "curr_progress": len(self.sequence) - 1,
                "max_progress": len(self.sequence) - 1,
                "serial": self.serial_number,
            }
        )

    # --- sampling and streaming (as receive_sample in the real file) ---------------------------------

    def receive_sample(self, next_token, results) -> bool:
        self.new_tokens += 1
        token = next_token.item()
        self.sequence.append(token)
        gen = self.generator
        page_size = gen.page_size

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
                r.update(
                    {
                        "full_completion": self.full_completion,
                        "new_tokens": self.new_tokens,
                        "prompt_tokens": self.input_ids.shape[-1],
                        "time_enqueued": self.time_first_prefill - self.time_enqueue,
                        "time_prefill": self.time_first_token - self.time_first_prefill,
                        "time_generate": self.time_last_token - self.time_first_token,
                        "cached_pages": self.cached_pages,
                        "cached_tokens": self.cached_pages * page_size + self.cached_tokens,
                    }
                )
                if gen.draft_model or gen.use_ngram_draft:
                    r.update(
                        {
                            "accepted_draft_tokens": self.accepted_draft_tokens,
                            "rejected_draft_tokens": self.rejected_draft_tokens,
                        }
                    )
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

        # Decode and buffer output (as the real file: every token is held first, then released or kept).
        new_text = gen.tokenizer.get_id_to_piece_list(self.decode_special_tokens)[token]
        self.held_text += new_text
        self.held_tokens.append(token)

        if token in self.stop_tokens:
            return emit(emit_eos=True, eos_reason="stop_token", stop_token=token)
        if self.new_tokens >= self.max_new_tokens - gen.num_draft_tokens:
            return emit(emit_eos=True, emit_held=True, eos_reason="max_new_tokens")

        # Hold text if it contains an incomplete character.
        if 1 <= self.held_text.count("\ufffd") < 5:
            test_decode = gen.tokenizer.decode(
                torch.tensor([self.held_tokens], dtype=torch.long),
                decode_special_tokens=self.decode_special_tokens,
            )[0]
            if "\ufffd" not in test_decode:
                self.held_text = test_decode
            else:
                return emit()

        # End on stop strings; hold text while it ends in the start of one.
        if self.stop_strings:
            match = partial_strings_match(self.held_text, list(self.stop_strings))
            if match >= 0:
                held = self.held_text[match:]
                self.held_text = self.held_text[:match]
                for s in self.stop_strings:
                    if held.startswith(s):
                        return emit(
                            emit_eos=True,
                            emit_held=True,
                            eos_reason="stop_string",
                            stop_string=s,
                            rem_held_text=held,
                        )
                raise AssertionError("Detected stop string but couldn't identify it (logic error)")
            if match == -2:
                return emit()

        return emit(emit_held=True)


def partial_strings_match(held_text: str, strings: list[str]) -> int:
    """exllamav2_ext's `partial_strings_match` (cpp/generator.cpp), step for step on code points.

    -1: no match; -2: some string overlaps the end of `held_text` partly (checked string by string, so a partial
    overlap with an earlier string wins over a full match of a later one); >= 0: index of a full match.
    """
    q = held_text
    for s in strings:
        a = 0
        while a < len(q):
            a0 = a
            b = 0
            while True:
                same = q[a] == s[b]
                a += 1
                b += 1
                if not same:
                    break
                if b == len(s):
                    return a0
                if a == len(q):
                    return -2
            a = a0 + 1
    return -1
