"""Tree and multi-draft verification (docs/trees.md): layout, references, the entry mixin."""

from spec_samplers.tree.entries import TreeEntries
from spec_samplers.tree.layout import POLICIES, TreeBatch
from spec_samplers.tree.output import TreeOutput

__all__ = ["POLICIES", "TreeBatch", "TreeEntries", "TreeOutput"]
