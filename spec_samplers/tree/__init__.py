"""Tree and multi-draft verification (docs/trees.md): layout, references, the entry mixin."""

from spec_samplers.layout import POLICIES, TreeBatch
from spec_samplers.output import TreeOutput
from spec_samplers.tree.entries import TreeEntries

__all__ = ["POLICIES", "TreeBatch", "TreeEntries", "TreeOutput"]
