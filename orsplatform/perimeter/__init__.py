"""The perimeter: what a connection and a request body may cost the server before anyone has
signed in. ``descriptors`` raises the descriptor limit and sizes the connection cap below it,
``connections`` is uvicorn's httptools protocol with a header deadline and that cap, ``bodies``
counts the bytes a request actually sends to Django. See docs/perimeter.md."""
