"""PyTorch / ``transformers`` code shipped inside every exported model directory (package data,
copied by ``t5like.tools.export_hf``). Not imported by t5like itself: torch is no dependency."""
