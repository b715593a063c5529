"""Stand-in for exllamav3/generator/generator.py (1.6.5): the Generator API, scripted instead of computed.

Follows the real file where the backend can observe it:
- the constructor's signature (lines 41-75, ending in `**kwargs`: unknown keywords are swallowed, as here) and its
  checks: a draft model and n-gram drafting together assert, the draft cache must be as large as the cache
  (lines 252-260); a recurrent MTP head asserts (lines 259-264); `num_draft_tokens` defaults to 4 with a drafter
  and is 0 without one (lines 265-277), and an MTP head shallower than it prints a warning (lines 269-273);
- a model with recurrent layers (`caps["recurrent_states"]`): a cache whose `max_history` is below the widest pass
  is a ValueError, every recurrent cache's slots are reset and clamp the batch (lines 373-410), the checkpoint
  interval comes from the model's caps (lines 411-420); a head with `caps["attach_target"]` is bound to the model
  (`attach_to`, lines 423-424) before `mtp_draft` is read (line 426);
  `max_draft_tokens` (line 288) sizes `draft_ids_pinned` (lines 334-344); the dynamic-draft calibrator exists only
  with `dynamic_draft_tokens` and a draft model (lines 289, 433-436); a new generator over the same cache takes it
  over (`owner_serial`, lines 243-245) and the old one refuses to iterate (lines 741-751);
- `iterate()` (lines 674-836): "started"/"prefill"/"streaming" results; a draft model drafts `num_draft_tokens`
  (`draft_window`, line 794) and not at all at 0; n-gram drafts up to `num_draft_tokens` (line 1404);
- `iterate_gen` (lines 1609-2030): accepted drafts count one by one, the rest of a rejected window at once
  (`reject_remainder`, line 1774), and at EOS the window's unresolved positions count as rejected, patched into the
  end result (lines 1924-1938); `record_draft_stats` appends (position, window, accepted) (lines 2000-2005);
- `cancel(job)` (lines 649-671), `reap_failed_job` and its `"stage": "error"` result (lines 2135-2163), `close()`.
"""

from __future__ import annotations

import threading
import time

import torch

from exllamav3.constants import PAGE_SIZE


class DraftConfidenceCalibrator:
    """Stand-in for generator/draft_confidence.py: the stand-in only needs it to exist."""

    def __init__(self, confidence: float):
        self.confidence = confidence


class Generator:
    def __init__(
        self,
        model,
        cache,
        tokenizer,
        max_batch_size: int = 256,
        max_chunk_size: int = 2048,
        shared_chunk_size: int | None = None,
        prefill_cooldown: int | None = 4,
        max_q_size: int = 8,
        draft_model=None,
        draft_cache=None,
        num_draft_tokens: int | None = None,
        show_visualizer: bool = False,
        enable_defrag: bool = True,
        cpu_cache_size: int = 0,
        disk_cache_dir: str | None = None,
        disk_cache_size: int = 50 * 1024**3,
        disk_cache_flush_on_idle: bool = True,
        disk_cache_checkpoint_interval: int = 4096,
        disk_cache_write_interval: float = 2.0,
        recurrent_cache_size: int = 4 * 1024**3,
        recurrent_checkpoint_interval: int = None,
        recurrent_checkpoint_interval_pp: int = 32768,
        ngram_match_min: int = 0,
        dynamic_draft_tokens: bool = False,
        draft_confidence: float = 0.4,
        record_draft_stats: bool = False,
        ngram_corpus: str | None = None,
        hybrid_draft_tokens: int = 0,
        draft_max_rows: int = 0,
        sparse_draft_head: int = 0,
        **kwargs,
    ):
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        cache.owner_serial = getattr(cache, "owner_serial", 0) + 1
        self.cache_owner_serial = cache.owner_serial
        self.max_total_tokens = cache.max_num_tokens
        self.draft_model = draft_model
        self.draft_cache = draft_cache
        if draft_model:
            assert not ngram_match_min, "Cannot use both draft model and n-gram draft."
            assert draft_cache is not None, "Must supply cache for draft model"
            assert draft_cache.max_num_tokens == cache.max_num_tokens, (
                "Cache and draft cache must be same size"
            )
            if draft_model.caps.get("recurrent_states"):
                assert not draft_model.caps.get("mtp_draft"), "Recurrent MTP draft models are not supported."
            if num_draft_tokens:
                self.num_draft_tokens = num_draft_tokens
            else:
                self.num_draft_tokens = 4
            depths = draft_model.caps.get("mtp_depths")
            if depths is not None and self.num_draft_tokens > depths:
                print(
                    f" !! Warning: the MTP head has {depths} depth-specialized layers; draft positions past "
                    f"{depths} reuse the last one, with decreasing acceptance (num_draft_tokens = "
                    f"{self.num_draft_tokens})"
                )
        elif ngram_match_min:
            self.num_draft_tokens = num_draft_tokens if num_draft_tokens is not None else 4
        else:
            self.num_draft_tokens = 0
        self.ngram_match_min = ngram_match_min
        self.hybrid_draft_tokens = max(0, hybrid_draft_tokens or 0)
        self.max_draft_tokens = max(self.num_draft_tokens, self.hybrid_draft_tokens)
        self.dynamic_draft = dynamic_draft_tokens and self.num_draft_tokens > 0
        self.record_draft_stats = record_draft_stats
        self.max_batch_size = max_batch_size
        self.pending_jobs = []
        self.active_jobs = []
        self.job_serial = 0
        self.filter_pool = None
        if draft_model or ngram_match_min or self.hybrid_draft_tokens:
            self.draft_ids_pinned = torch.empty((max_batch_size, self.max_draft_tokens), dtype=torch.long)
        self.target_recurrent = bool(model.caps.get("recurrent_states"))
        self.draft_recurrent = bool(draft_model is not None and draft_model.caps.get("recurrent_states"))
        if self.target_recurrent and self.max_draft_tokens > cache.max_history:
            raise ValueError(
                f"Speculative passes of up to {self.max_draft_tokens} draft tokens need a cache with "
                f"max_history >= {self.max_draft_tokens} on a recurrent model (this cache has "
                f"max_history = {cache.max_history})"
            )
        if self.draft_recurrent and self.num_draft_tokens > draft_cache.max_history:
            raise ValueError(
                f"A recurrent draft model drafting {self.num_draft_tokens} tokens needs a draft cache with "
                f"max_history >= {self.num_draft_tokens} (this cache has max_history = {draft_cache.max_history})"
            )
        for c, recurrent in ((cache, self.target_recurrent), (draft_cache, self.draft_recurrent)):
            if recurrent:
                c.reset_states()
                self.max_batch_size = min(self.max_batch_size, c.num_slots)
        if recurrent_checkpoint_interval is None:
            schedule_model = model if self.target_recurrent or not self.draft_recurrent else draft_model
            recurrent_checkpoint_interval = schedule_model.caps.get(
                "default_recurrent_checkpoint_interval", 2048
            )
        self.recurrent_checkpoint_interval = recurrent_checkpoint_interval
        if draft_model is not None and draft_model.caps.get("attach_target"):
            draft_model.attach_to(model)
        self.mtp_draft = self.draft_model is not None and self.draft_model.caps.get("mtp_draft", False)
        self.draft_calibrator = None
        if self.dynamic_draft and self.draft_model is not None:
            self.draft_calibrator = DraftConfidenceCalibrator(draft_confidence)
        self.closed = False
        self.standin_cached_sequences = []
        self.standin_jobs = []
        self.standin_draft_behind = False
        self.standin_iterate_thread = None

    def num_remaining_jobs(self):
        return len(self.pending_jobs) + len(self.active_jobs)

    def enqueue(self, job):
        if isinstance(job, list):
            return [self.enqueue(j) for j in job]
        job.prepare_for_queue(self, self.job_serial)
        self.job_serial += 1
        self.pending_jobs.append(job)
        self.standin_jobs.append(job)
        return job.serial_number

    def cancel(self, job):
        if job in self.pending_jobs:
            self.pending_jobs.remove(job)
        elif job in self.active_jobs:
            job.deallocate_pages()
            self.active_jobs.remove(job)

    def close(self):
        self.closed = True

    def reap_failed_job(self, job, error, results):
        job.deallocate_pages()
        if job in self.active_jobs:
            self.active_jobs.remove(job)
        results.append(
            {"job": job, "serial": job.serial_number, "stage": "error", "eos": True, "error": error}
        )

    def iterate(self) -> list[dict]:
        assert self.cache.initialized, (
            "Cache tensors were never allocated. Construct the Cache BEFORE calling model.load()"
        )
        if self.cache.owner_serial != self.cache_owner_serial:
            self.pending_jobs.clear()
            self.active_jobs.clear()
            raise RuntimeError(
                "This Generator no longer owns its Cache: a newer Generator was created over the same "
                "Cache. Close or discard the old Generator before creating a new one."
            )
        assert self.draft_cache is None or self.draft_cache.initialized, (
            "Draft cache tensors were never allocated. Construct the draft Cache BEFORE calling draft_model.load()"
        )
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

        draft_window = self.num_draft_tokens if self.draft_model else 0
        if self.draft_model and draft_window > 0:
            if self.draft_calibrator is not None:
                script = self.model.config.standin.get("dynamic_window") or [draft_window]
                rounds = self.active_jobs[0].standin_round if self.active_jobs else 0
                draft_window = max(1, min(draft_window, script[rounds % len(script)]))
            config = self.model.config if self.mtp_draft else self.draft_model.config
            schedule = config.standin.get("mtp_acceptance" if self.mtp_draft else "draft_acceptance", [1])
            draft_tokens = self.scripted_drafts(schedule, draft_window, behind=self.standin_draft_behind)
        elif self.draft_model:
            # No draft forward at K = 0: the draft cache gets nothing for these positions.
            if any(job.is_prefill_done() for job in self.active_jobs):
                self.standin_draft_behind = True
            draft_tokens = None
        elif self.ngram_match_min:
            window = self.num_draft_tokens
            draft_tokens = (
                self.scripted_drafts(self.model.config.standin.get("ngram_acceptance", [1]), window)
                if window > 0
                else None
            )
        else:
            draft_tokens = None
        self.iterate_gen(results, draft_tokens)
        return results

    def scripted_drafts(self, schedule, window, behind=False):
        rows = []
        for job in self.active_jobs:
            if not job.is_prefill_done():
                continue
            accept = 0 if behind else (schedule[job.standin_round % len(schedule)] if schedule else 0)
            ids = []
            for i in range(window):
                right = job.standin_target_token(job.new_tokens + i)
                ids.append(right if i < accept else (right + 1) % self.tokenizer.actual_vocab_size)
            rows.append(ids)
        if not rows:
            return None
        for b, ids in enumerate(rows):
            for i, t in enumerate(ids):
                self.draft_ids_pinned[b, i] = t
        return self.draft_ids_pinned[: len(rows), :window]

    def iterate_gen(self, results, draft_tokens=None):
        completed_jobs = []
        j = 0
        for job in list(self.active_jobs):
            if not job.is_prefill_done():
                continue
            if job.time_first_token is None:
                job.time_first_token = time.time()
            q = 1 + (draft_tokens.shape[-1] if draft_tokens is not None else 0)
            job.standin_round += 1
            accepted_length = 0
            failed = False
            for i in range(q):
                error_at = self.model.config.standin.get("error_at")
                if error_at is not None and job.new_tokens >= error_at:
                    self.reap_failed_job(job, RuntimeError("CUDA error: an illegal memory access"), results)
                    failed = True
                    break
                token = job.standin_target_token(job.new_tokens)
                accepted_length += 1
                eos = job.receive_sample(torch.tensor([[token]], dtype=torch.long), results)
                if eos:
                    num_unresolved = q - 1 - i if draft_tokens is not None else 0
                    if num_unresolved:
                        job.rejected_draft_tokens += num_unresolved
                        for r_ in reversed(results):
                            if r_.get("eos") and r_["job"] is job:
                                if "rejected_draft_tokens" in r_:
                                    r_["rejected_draft_tokens"] = job.rejected_draft_tokens
                                break
                    completed_jobs.append(job)
                    break
                if draft_tokens is not None and i < q - 1:
                    if draft_tokens[j, i].item() != token:
                        job.rejected_draft_tokens += q - 1 - i
                        break
                    job.accepted_draft_tokens += 1
            if draft_tokens is not None and not failed and self.record_draft_stats:
                job.draft_stats.append((job.new_tokens, draft_tokens.shape[-1], accepted_length - 1))
            j += 1
        for job in completed_jobs:
            job.deallocate_pages()
            self.active_jobs.remove(job)


__all__ = ["PAGE_SIZE", "Generator"]
