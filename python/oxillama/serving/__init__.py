"""Many users at once: the asyncio engine and sessions over one batching
scheduler, the OpenAI-compatible HTTP app (``http/``) and its Ray Serve
deployment (``ray/``)."""
