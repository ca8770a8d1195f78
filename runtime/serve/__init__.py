"""`edgellm serve`: an OpenAI-compatible HTTP server over the Python Runtime (FastAPI + uvicorn).

  slots.py       N contexts on one model (llama-server's slots): requests beyond them queue; each slot keeps its
                 conversation's KV cache, so a request that extends it prefills only what is new
  openai_api.py  the request schema (the OpenAI subset served; unknown fields refused) and response shapes
  app.py         the routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /slots, /
  static/        the built-in chat page served at /
"""
