"""Deletion: the one deletion policy and everything that asks it. The shared-state
registry says who holds which file; the cleaners discard (in the caller's thread, in the
background, or in bulk for an outside gc); the sweep and reconcile find orphans; `gc` is
the outside writer's gc."""
