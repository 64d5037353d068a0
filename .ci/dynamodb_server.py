"""moto's DynamoDB-compatible server for the DynamoDB store's suite, one request at a time.

`moto_server` answers each request on a thread of its own, and moto checks a write's condition and
applies it in two Python steps: two conditional writes that run at once can both pass their
condition, which DynamoDB never lets happen to one item. This server runs moto's same application
behind one lock (requests are still accepted concurrently, and answered in turn), so every
conditional write is atomic as it is on DynamoDB. Usage: dynamodb_server.py HOST PORT.
"""

import logging
import sys
import threading

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def one_at_a_time(environ, start_response):
        with lock:
            response = app(environ, start_response)
            try:
                return [b"".join(response)]
            finally:
                close = getattr(response, "close", None)
                if close is not None:
                    close()

    run_simple(
        host,
        port,
        one_at_a_time,
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
