"""fleet-eval: is an LLM serving target numerically faithful to a reference, and how fast is it.

Data flows one way: manifest -> plan -> scheduler -> actors (one per card) -> store (Parquet)
-> analysis (Polars) -> report. Importing this package loads no torch, vllm or transformers.
"""

__version__ = "0.1.0"
