"""The bytes NIXL moves for a KV block, read where they are.

vLLM's NIXL worker registers its KV cache as *regions* (one per layer, or per K/V half, or per
packed row) and moves block ``k`` of region ``r`` as the ``block_len[r]`` bytes at
``base[r] + k * stride[r]``. A :class:`Regions` is built from that same registration (the
worker's ``kv_caches_base_addr``, ``block_len_per_layer`` and ``block_stride_per_layer``) over
the tensors that hold it, so what is digested is exactly what the READ moved: no layout of
vLLM's is re-derived here.

A block's digest is ``mix64`` over its per-region digests (region order is the registration's
order, which both sides share), its set digest the sum of its per-region set digests (a rewrite
that rearranges words within each region's block keeps it): one gather and one elementwise pass per region on the device
the KV cache lives on, and only the 8-byte digests come back to the host. Blocks are never
copied to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..digest import ALGORITHM, MIX64, WITH_SETS, BlockDigests, BlockError, _digest_rows, block_digests, digest_blocks


class RegionError(ValueError):
    """The registration cannot be read back as tensors (an address no tensor holds)."""


@dataclass(frozen=True)
class _Region:
    view: object  # torch uint8 tensor (num_blocks, block_len), strided over the KV cache
    block_len: int


class Regions:
    def __init__(self, regions: list[_Region], memory: str, device: int):
        if not regions:
            raise RegionError("no registered KV regions")
        self._regions = regions
        self.memory = memory
        self.device = device

    @classmethod
    def of_worker(cls, worker) -> "Regions":
        """The regions a vLLM NIXL worker registered (after ``register_kv_caches``)."""
        import torch

        buffers = worker.host_xfer_buffers if getattr(worker, "use_host_buffer", False) else worker.device_kv_caches
        tensors = list(buffers.values()) if isinstance(buffers, dict) else []
        bases = worker.kv_caches_base_addr[worker.engine_id][worker.tp_rank]
        lens = list(worker.block_len_per_layer)
        strides = list(worker.block_stride_per_layer)
        counts = list(worker.region_num_blocks)
        if not (len(bases) == len(lens) == len(strides) == len(counts)):
            raise RegionError(
                f"registration lists disagree: {len(bases)} bases, {len(lens)} lengths, "
                f"{len(strides)} strides, {len(counts)} block counts"
            )
        regions = []
        memory, device = "dram", 0
        for base, block_len, stride, count in zip(bases, lens, strides, counts):
            owner = None
            for t in tensors:
                storage = t.untyped_storage()
                start = storage.data_ptr()
                if start <= base < start + storage.nbytes():
                    owner = t
                    break
            if owner is None:
                raise RegionError(f"region at {base:#x}: no KV tensor holds it")
            storage = owner.untyped_storage()
            start, size = storage.data_ptr(), storage.nbytes()
            offset = base - start
            # The last block's stride may run past the storage; only block_len bytes of it count.
            if count <= 0 or offset + (count - 1) * stride + block_len > size:
                raise RegionError(f"region at {base:#x}: {count} blocks of {block_len} bytes overrun its tensor")
            flat = torch.empty(0, dtype=torch.uint8, device=owner.device)
            flat.set_(storage, 0, (size,), (1,))
            view = flat.as_strided((count, block_len), (stride, 1), offset)
            regions.append(_Region(view=view, block_len=int(block_len)))
            if owner.is_cuda:
                memory, device = "vram", int(owner.device.index or 0)
        return cls(regions, memory, device)

    @property
    def block_bytes(self) -> int:
        return sum(r.block_len for r in self._regions)

    def layout(self) -> str:
        """What both sides must share for digests to compare: region count and lengths."""
        body = np.array([len(self._regions)] + [r.block_len for r in self._regions], dtype="<u8")
        return format(int(digest_blocks([body.view(np.uint8)], MIX64)[0][0]), "016x")

    def _rows(self, region: _Region, ids: list[int], width: int | None = None):
        """Blocks ``ids`` of ``region`` (their first ``width`` bytes; None: all), gathered on the
        KV cache's device."""
        import torch

        count = region.view.shape[0]
        if min(ids) < 0 or max(ids) >= count:
            raise BlockError(f"block ids outside 0..{count - 1}")
        index = torch.as_tensor(ids, dtype=torch.long, device=region.view.device)
        view = region.view if width is None else region.view[:, : min(width, region.block_len)]
        return view.index_select(0, index)

    def _combined(self, per_region: np.ndarray) -> np.ndarray:
        """One value per block: ``mix64`` over its per-region values, in registration order."""
        width = 8 * len(self._regions)
        return _digest_rows(np.ascontiguousarray(per_region).view(np.uint8).reshape(per_region.shape[0], width),
                            width, MIX64)

    def fingerprints(self, block_ids, sample: int = 4096) -> np.ndarray:
        """A cheap fingerprint of physical blocks ``block_ids`` (uint64[n]): the digest of the first
        ``sample`` bytes of the block in every region. Taken before a READ is posted and again
        after it completed, an unchanged fingerprint of a block that does not match its manifest
        says the READ never wrote it (``untouched``); taken when a source lends blocks out and
        again when their READ is confirmed, a changed one says they were rewritten meanwhile."""
        ids = [int(b) for b in block_ids]
        if not ids:
            return np.zeros(0, np.uint64)
        per_region = np.empty((len(ids), len(self._regions)), np.uint64)
        for i, region in enumerate(self._regions):
            per_region[:, i] = digest_blocks(self._rows(region, ids, sample), MIX64)[0]
        return self._combined(per_region)

    def digests(self, block_ids, algorithm: int = ALGORITHM) -> BlockDigests:
        """Digests, set digests (an algorithm with them) and byte lengths of physical blocks
        ``block_ids``."""
        ids = [int(b) for b in block_ids]
        if not ids:
            raise BlockError("no blocks: nothing to verify")
        per_region = np.empty((len(ids), len(self._regions)), np.uint64)
        sets = np.zeros(len(ids), np.uint64) if algorithm in WITH_SETS else None
        for i, region in enumerate(self._regions):
            d = block_digests(self._rows(region, ids), algorithm)
            per_region[:, i] = d.digests
            if sets is not None:
                with np.errstate(over="ignore"):
                    sets += d.sets
        return BlockDigests(self._combined(per_region), sets, np.full(len(ids), self.block_bytes, np.uint32))
