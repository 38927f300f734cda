"""`pad_collate`: a collate function for variable-length sequences, with the attention mask.

A *sequence* is a tensor (or a list of numbers) whose first dimension varies between samples.
Samples may be:
- sequences: the batch is ``(padded, mask)``, ``padded`` of shape ``[batch, length, ...]``;
- dicts: each key whose values are sequences of differing lengths — or that is listed in
  ``sequence_keys`` — is padded; lists of non-numbers (words, paths) stay a list per sample; other
  keys go through ``default_collate``; ``attention_mask`` (name: ``mask_key``) is added from the
  first padded key;
- tuples/lists of fields: like dicts, by position; the mask is appended as the last field.

The mask is ``True`` (or 1, see ``mask_dtype``) on real positions. ``pad_to_multiple_of=8`` rounds
the padded length up (tensor cores want dimensions that are multiples of 8 for fp16/bf16).
Bind options with ``functools.partial(pad_collate, pad_to_multiple_of=8)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import default_collate

from stepscope.errors import UsageError


def pad_collate(batch: Sequence[Any], *, pad_value: float | Mapping[str, float] = 0,
                pad_to_multiple_of: int | None = None, sequence_keys: Sequence[str] | None = None,
                mask_key: str = "attention_mask", mask_dtype: torch.dtype = torch.bool) -> Any:
    """Collate samples, padding their sequences to the longest (rounded up to a multiple).

    Args:
        batch: the samples (tensors/lists, dicts, or tuples).
        pad_value: padding value; a mapping gives one per dict key (e.g. ``{"labels": -100}``),
            missing keys pad with 0.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        sequence_keys: dict keys to pad even when all lengths are equal in this batch.
        mask_key: the name of the mask in dict batches.
        mask_dtype: dtype of the mask (``torch.bool``, or ``torch.long`` for Hugging Face models).

    Returns:
        ``(padded, mask)``, a dict with ``mask_key`` added, or a tuple with the mask last.

    Raises:
        UsageError: an empty batch, ``pad_to_multiple_of`` < 1, or samples of mixed kinds.
    """
    if not batch:
        raise UsageError("pad_collate got an empty batch")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise UsageError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
    first = batch[0]
    options = (pad_to_multiple_of, mask_dtype)
    if isinstance(first, Mapping):
        return _collate_fields({key: [sample[key] for sample in batch] for key in first},
                               pad_value, set(sequence_keys or ()), mask_key, options)
    if isinstance(first, tuple) or (isinstance(first, list) and first and _is_sequence(first[0])):
        fields = {index: [sample[index] for sample in batch] for index in range(len(first))}
        collated = _collate_fields(fields, pad_value, set(), mask_key, options)
        mask = collated.pop(mask_key, None)
        return tuple(collated[index] for index in range(len(first))) + (() if mask is None else (mask,))
    value = pad_value if not isinstance(pad_value, Mapping) else 0
    return _pad([_as_tensor(sample) for sample in batch], value, *options)


def _collate_fields(fields: dict[Any, list[Any]], pad_value: Any, sequence_keys: set, mask_key: str,
                    options: tuple) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    mask = None
    for key, values in fields.items():
        if key in sequence_keys or _varies(values):
            value = pad_value.get(key, 0) if isinstance(pad_value, Mapping) else pad_value
            out[key], key_mask = _pad([_as_tensor(item) for item in values], value, *options)
            mask = key_mask if mask is None else mask
        elif isinstance(values[0], list) and not _numeric(values[0]):
            out[key] = values  # words, file names …: kept as a list per sample
        else:
            out[key] = default_collate(values)
    if mask is not None:
        out[mask_key] = mask
    return out


def _pad(sequences: list[torch.Tensor], value: float, multiple: int | None, mask_dtype: torch.dtype
         ) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(sequence) for sequence in sequences])
    padded = pad_sequence(sequences, batch_first=True, padding_value=value)
    if multiple and padded.shape[1] % multiple:
        extra = multiple - padded.shape[1] % multiple
        filler = padded.new_full((padded.shape[0], extra, *padded.shape[2:]), value)
        padded = torch.cat([padded, filler], dim=1)
    mask = torch.arange(padded.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return padded, mask.to(mask_dtype)


def _is_sequence(item: Any) -> bool:
    """A tensor with a first dimension, or a list of numbers (lists of anything else pass through)."""
    if isinstance(item, torch.Tensor):
        return item.dim() >= 1
    return isinstance(item, list) and _numeric(item)


def _numeric(items: list) -> bool:
    return not items or isinstance(items[0], (int, float, bool, list))


def _varies(values: list[Any]) -> bool:
    if not all(_is_sequence(value) for value in values):
        return False
    return len({len(value) for value in values}) > 1


def _as_tensor(item: Any) -> torch.Tensor:
    if isinstance(item, torch.Tensor):
        return item
    if isinstance(item, (list, tuple)):
        try:
            return torch.tensor(item)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"pad_collate cannot pad {str(item)[:40]}: {exc}") from exc
    raise UsageError(f"pad_collate cannot pad a {type(item).__name__}; give tensors or lists of numbers")
