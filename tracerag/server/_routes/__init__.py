"""The server's routers: the frontend API (``api``) and the review desk (``review``)."""
