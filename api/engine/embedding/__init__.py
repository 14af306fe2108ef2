"""Embedding models: Optimum ONNX exports of sentence encoders and last-token decoders.

`protocol.EmbeddingClient` is what the serving layer sees; `engine.LocalEmbeddingEngine` serves
one export, whose pooling `pooling.py` reads from the export's own files, through a batcher of its
own (`batcher.py`) that packs every client's inputs under a token budget on a worker thread, so
embedding traffic never runs on the event loop or in the chat scheduler's steps.
"""
