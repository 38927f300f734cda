"""pad_collate: padding, masks, multiples of 8, dict and tuple samples."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.data import pad_collate
from stepscope.errors import UsageError


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 20), min_size=1, max_size=8), multiple=st.sampled_from([None, 1, 8]))
def test_padded_lengths_and_mask(lengths, multiple):
    batch = [torch.arange(1, n + 1) for n in lengths]
    padded, mask = pad_collate(batch, pad_to_multiple_of=multiple)
    width = max(lengths)
    if multiple:
        width = -(-width // multiple) * multiple
    assert padded.shape == (len(lengths), width) and mask.dtype == torch.bool
    assert mask.sum(dim=1).tolist() == lengths
    for row, n in zip(padded, lengths):
        assert row[:n].tolist() == list(range(1, n + 1)) and not row[n:].any()


def test_dict_samples_pad_varying_keys_and_collate_the_rest():
    batch = [{"input_ids": [1, 2, 3], "labels": [4, 5, 6], "label": 0, "text": "a", "words": ["x", "y"]},
             {"input_ids": [7], "labels": [8], "label": 1, "text": "b", "words": ["z"]}]
    out = pad_collate(batch, pad_value={"labels": -100}, pad_to_multiple_of=8, mask_dtype=torch.long)
    assert out["input_ids"].tolist() == [[1, 2, 3, 0, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0, 0, 0]]
    assert out["labels"][1].tolist() == [8] + [-100] * 7
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]]
    assert out["label"].tolist() == [0, 1] and out["text"] == ["a", "b"] and out["words"] == [["x", "y"], ["z"]]


def test_sequence_keys_pad_even_equal_lengths_and_features_keep_their_shape():
    batch = [{"frames": torch.ones(2, 3)}, {"frames": torch.ones(2, 3)}]
    collate = partial(pad_collate, sequence_keys=["frames"], pad_to_multiple_of=4)
    out = collate(batch)
    assert out["frames"].shape == (2, 4, 3) and out["attention_mask"].sum().item() == 4


def test_tuple_samples_get_the_mask_last():
    padded, label, mask = pad_collate([(torch.tensor([1, 2]), 3), (torch.tensor([4]), 5)])
    assert padded.tolist() == [[1, 2], [4, 0]] and label.tolist() == [3, 5] and mask.tolist() == [[1, 1], [1, 0]]


def test_bad_input():
    with pytest.raises(UsageError, match="empty"):
        pad_collate([])
    with pytest.raises(UsageError, match="multiple"):
        pad_collate([torch.ones(2)], pad_to_multiple_of=0)
    with pytest.raises(UsageError, match="cannot pad"):
        pad_collate(["ab", "c"])
    with pytest.raises(UsageError, match="cannot pad"):
        pad_collate([{"ids": [1, "b"]}, {"ids": [3]}])
