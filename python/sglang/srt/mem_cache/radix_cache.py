"""RadixCache: the KV slots of computed token sequences, kept in a radix tree keyed by token ids.

A request reuses the longest cached prefix of its prompt and prefills only the rest. The tree
holds the K/V of finished requests and of running ones: a prompt chunk is inserted when its
step is scheduled (each layer stores a step's K/V before any row attends, so a request later
in the same step may already reuse it; later steps run after it). This is also how the n > 1
children of one request share their prompt.

Ownership is counted per slot: the tree holds one reference on each slot it stores, a request
one on each slot of its row. A slot goes back to the allocator when its count reaches zero. A
request locks the deepest node it uses, and with it every ancestor; unlocked leaves are evicted
least recently used first when the allocator runs short.

Recency is a logical clock, not wall time: TP ranks run the same scheduling decisions on the
same inputs, so each builds the same tree and evicts the same nodes.

A step that fails (managers/step_failures.py) leaves garbage in the slots it was to write:
poison() marks every node holding one of them, and its descendants (computed on top of it);
matching stops before a poisoned node, and discard() releases a failed request without caching
its row. Poisoned nodes are evicted like any other once no request holds them.

`align` > 1 (the deterministic mode) keeps only whole chunks of `align` tokens computed by
prefill: such a chunk has the same bits in every run, so a cached run's tokens equal an
uncached run's.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Optional, Protocol

import torch

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator


class Req(Protocol):
    """What the cache reads and writes on a request (the scheduler's Req)."""

    req_pool_idx: Optional[int]
    kv_len: int  # tokens whose K/V are in the cache
    last_node: Any  # the deepest node the request holds locked
    extra_key: Optional[str]  # its prefix-cache namespace

    @property
    def fill_ids(self) -> list[int]: ...  # the tokens its row holds K/V for, in order


EVICT_BATCH_DIVISOR = 64  # an eviction frees at least 1/64 of the pool


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access", "node_id", "poisoned")

    def __init__(self, key: list[int], value: torch.Tensor, parent: Optional["TreeNode"], node_id: int) -> None:
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key = key  # token ids of this edge
        self.value = value  # [len(key)] int64 KV slots, host
        self.lock_ref = 0
        self.last_access = 0
        self.node_id = node_id
        self.poisoned = False  # its K/V (or a prefix's) were to be written by a failed step


class RadixCache:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: TokenToKVPoolAllocator,
        disable: bool = False,
        align: int = 1,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.disable = disable
        self.align = align
        self.slot_refs = torch.zeros(allocator.size + 1, dtype=torch.int32)  # [S + 1] users per slot
        self._ids = itertools.count()
        self._clock = itertools.count(1)
        # One tree per namespace (a request's extra_key / cache_salt; None for the rest).
        self.roots: dict[Optional[str], TreeNode] = {}
        self._evictable = 0  # tokens in unlocked nodes
        self._protected = 0  # tokens in locked nodes

    def flush(self) -> None:
        """/flush_cache: drop every prefix no request uses (all of them once the server is idle)."""
        self.evict(self._evictable)

    # ------------------------------------------------------------------ sizes

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    # ------------------------------------------------------------------ tree

    def root(self, namespace: Optional[str] = None) -> TreeNode:
        """The namespace's tree, made on first use (eviction drops it again once empty, so
        clients sending many salts leave nothing behind)."""
        node = self.roots.get(namespace)
        if node is None:
            node = self.roots[namespace] = TreeNode([], torch.empty(0, dtype=torch.int64), None, next(self._ids))
        return node

    def match_prefix(self, key: list[int], namespace: Optional[str] = None) -> tuple[torch.Tensor, Optional[TreeNode]]:
        """The slots of the longest cached prefix of `key` ([M] int64) and the node it ends at
        (split there if it ended inside an edge, so that exactly the match can be locked)."""
        node, parts, i = self.roots.get(namespace), [], 0
        if node is None:
            return torch.empty(0, dtype=torch.int64), None
        tick = next(self._clock)
        while i < len(key):
            child = node.children.get(key[i])
            if child is None or child.poisoned:
                break
            child.last_access = tick
            n = _common_len(child.key, key, i)
            if n < len(child.key):
                child = self._split(child, n)
            parts.append(child.value)
            i += n
            node = child
        slots = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        return slots, node

    def prefix_len(self, key: list[int], namespace: Optional[str] = None) -> int:
        """Length of the longest cached prefix of `key`, without touching the tree."""
        node, i = self.roots.get(namespace), 0
        if node is None:
            return 0
        while i < len(key):
            child = node.children.get(key[i])
            if child is None or child.poisoned:
                break
            n = _common_len(child.key, key, i)
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def insert(self, key: list[int], slots: torch.Tensor, namespace: Optional[str] = None) -> TreeNode:
        """Store `slots` ([len(key)] int64) as the K/V of `key`; returns the node `key` ends at.
        Where a prefix is cached already the tree keeps its own slots, and the caller's copies
        stay the caller's."""
        node, i = self.root(namespace), 0
        tick = next(self._clock)
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                leaf = TreeNode(list(key[i:]), slots[i:].clone(), node, next(self._ids))
                leaf.last_access = tick
                node.children[key[i]] = leaf
                self.slot_refs[leaf.value] += 1
                self._evictable += len(leaf.key)
                return leaf
            child.last_access = tick
            n = _common_len(child.key, key, i)
            if n < len(child.key):
                child = self._split(child, n)
            i += n
            node = child
        return node

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child`'s edge after n tokens; returns the new upper node."""
        upper = TreeNode(child.key[:n], child.value[:n], child.parent, next(self._ids))
        upper.lock_ref, upper.last_access, upper.poisoned = child.lock_ref, child.last_access, child.poisoned
        child.parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child.key[0]] = child
        return upper

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Remove unlocked leaves, least recently used first, until `num_tokens` slots went back
        to the allocator (or nothing is left to evict); returns the number freed."""
        heap = [(n.last_access, n.node_id, n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            self._evictable -= len(leaf.key)
            freed += self._unref(leaf.value)
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
            elif parent.parent is None and not parent.children:
                self.roots = {ns: root for ns, root in self.roots.items() if root is not parent}
        return freed

    def _leaves(self) -> list[TreeNode]:
        leaves, stack = [], list(self.roots.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.parent is not None:
                leaves.append(node)
        return leaves

    # ------------------------------------------------------------------ slots

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        """[n] int64 fresh slots (each with one user), evicting cached prefixes if needed."""
        short = n - self.allocator.available_size()
        if short > 0:
            # Eviction walks the whole tree: free a batch at once rather than a few slots per
            # decode step once the pool is full.
            self.evict(max(short, self.allocator.size // EVICT_BATCH_DIVISOR))
        slots = self.allocator.alloc(n)
        if slots is not None:
            self.slot_refs[slots] = 1
        return slots

    def available_size(self) -> int:
        """Slots a new request can get: free ones plus those eviction can free."""
        return self.allocator.available_size() + self._evictable

    def _unref(self, slots: torch.Tensor) -> int:
        self.slot_refs[slots] -= 1
        unused = slots[self.slot_refs[slots] == 0]
        self.allocator.free(unused)
        return unused.numel()

    def fork_rows(self, dst_rows: list[int], src_rows: list[int], starts: list[int], ends: list[int]) -> None:
        """Beam forks: positions [starts[i], ends[i]) of dst row i take src row i's slots (the K/V
        is shared, not copied), every fork of a step in one call. Each slot counts the rows that
        use it; the slots no row uses any more (a dropped beam's tail) are freed."""
        if not dst_rows:
            return
        old, new = self.req_to_token_pool.copy_spans(dst_rows, src_rows, starts, ends)  # [T] each
        if old.numel() == 0:
            return
        self.slot_refs.index_add_(0, new, torch.ones_like(new, dtype=self.slot_refs.dtype))
        self.slot_refs.index_add_(0, old, torch.full_like(old, -1, dtype=self.slot_refs.dtype))
        candidates = old.unique()
        self.allocator.free(candidates[self.slot_refs[candidates] == 0])

    def share_prefix(self, dst_row: int, src_row: int, length: int) -> None:
        """A fresh row (a beam member) starts with the first `length` slots of `src_row`, shared."""
        _, slots = self.req_to_token_pool.copy_spans([dst_row], [src_row], [0], [length])
        self.slot_refs[slots] += 1

    # ------------------------------------------------------------------ requests

    def match_len(self, req: Req, limit: int) -> int:
        """How much of the request's first `limit` fill tokens the tree holds, aligned."""
        if self.disable:
            return 0
        return self._aligned(self.prefix_len(req.fill_ids[:limit], req.extra_key))

    def admit(self, req: Req, limit: int) -> int:
        """Point the start of the request's row at its longest cached prefix (at most `limit`
        tokens) and lock it; returns that prefix's length."""
        req.last_node = None
        if self.disable or limit <= 0:
            return 0
        fill = req.fill_ids  # the prompt, after a retraction also the output so far
        slots, node = self.match_prefix(fill[: self._aligned(limit)], req.extra_key)
        m = self._aligned(slots.numel())
        if m < slots.numel():
            slots, node = self.match_prefix(fill[:m], req.extra_key)
        if m == 0:
            return 0
        self.inc_lock_ref(node)
        req.last_node = node
        self.req_to_token_pool.write_prefix(req.req_pool_idx, slots)
        self.slot_refs[slots] += 1
        return m

    def cache_prefill(self, req: Req) -> None:
        """After a prefill chunk is scheduled: its prefix so far goes into the tree, locked by the request."""
        self._insert_row(req, self._aligned(min(req.kv_len, len(req.fill_ids))))

    def release(self, req: Req) -> None:
        """The request is done: its computed sequence stays cached (prompt and outputs, except in
        the aligned mode, whose decode K/V differ from prefill's), its own slots are dropped."""
        if not self.align > 1:
            self._insert_row(req, min(req.kv_len, len(req.fill_ids)))
        self.discard(req)

    def discard(self, req: Req) -> None:
        """Drop the request's locks and slots without caching anything more of its row."""
        row = req.req_pool_idx
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
            req.last_node = None
        self._unref(self.req_to_token_pool.slots_of(row, req.kv_len))
        self.req_to_token_pool.free(row)

    def free_tail(self, req: Req, length: int) -> None:
        """Give back the request's slots past its first `length` positions (the K/V of draft
        tokens a speculative verify rejected)."""
        row = self.req_to_token_pool.slots_of(req.req_pool_idx, req.kv_len)
        self._unref(row[length:])
        req.kv_len = length

    def poison(self, slots: torch.Tensor) -> None:
        """Mark the nodes holding any of `slots` ([N] int64, host), with their subtrees."""
        stack = [child for root in self.roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            if node.poisoned or bool(torch.isin(node.value, slots).any()):
                _mark_subtree(node)
            else:
                stack.extend(node.children.values())

    def _insert_row(self, req: Req, length: int) -> None:
        if self.disable or length <= 0 or length <= self._locked_len(req):
            return
        slots = self.req_to_token_pool.slots_of(req.req_pool_idx, length)
        node = self.insert(req.fill_ids[:length], slots, req.extra_key)
        self.inc_lock_ref(node)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.last_node = node

    def _locked_len(self, req: Req) -> int:
        n, node = 0, req.last_node
        while node is not None and node.parent is not None:
            n += len(node.key)
            node = node.parent
        return n

    def _aligned(self, n: int) -> int:
        return n - n % self.align


def _mark_subtree(node: TreeNode) -> None:
    stack = [node]
    while stack:
        node = stack.pop()
        node.poisoned = True
        stack.extend(node.children.values())


def _common_len(edge: list[int], key: list[int], start: int) -> int:
    """Tokens `edge` shares with key[start:], from the start."""
    n = min(len(edge), len(key) - start)
    for j in range(n):
        if edge[j] != key[start + j]:
            return j
    return n
