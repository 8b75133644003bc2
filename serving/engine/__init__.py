"""The built-in inference engine: Llama checkpoints, paged KV cache, prefix cache, batching.

No Django imports here: this package runs inside Ray Serve replicas.
"""
