"""Deletion: the one deletion policy and everything that asks it.

Bottom to top: `rule` (what both worlds' rules share: `Verdict`, and the protocol the one
deleter asks a rule through), `discard` (what may be deleted), `registry` (which holder
references which file; reads no storage), `holders` (the registry built from the
documents the job directory read, damaged ones quarantined), `policy` (what is
referenced, kept, protected or deletable, and the last check before any delete), the
cleaners (`cleaner` in the caller's thread; `async_cleaner` and `bulk_delete` in the
background, sharing `retry`; `bulk_delete` is the one guarded batch deleter both worlds'
gc use), then `sweep` and `reconcile` (orphans found in a streamed listing) and `gc` (the
outside writer's gc, re-checking liveness before every batch)."""
