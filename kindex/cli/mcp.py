"""``kindex mcp``: a KB (or every agent's KB under a folder) as an MCP server, over stdio or streamable HTTP."""

from __future__ import annotations

import logging
import os
import sys

import click

from kindex.errors import UsageError, missing_extra


@click.command("mcp")
@click.argument("kb", required=False, type=click.Path(file_okay=False, exists=True, path_type=str))
@click.option(
    "--kb-root",
    type=click.Path(file_okay=False, exists=True, path_type=str),
    help="Serve every agent's KB under this folder (<kb-root>/<agent>/); tools then take `agent`.",
)
@click.option("--http", "use_http", is_flag=True, help="Streamable HTTP at /mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --http: address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8766, show_default=True, help="With --http: port.")
def mcp_cmd(kb: str | None, kb_root: str | None, use_http: bool, host: str, port: int) -> None:
    """Serve KB to MCP clients (Claude, Cursor, Codex, VS Code…): search, get_context, read_document,
    list_topics, and in a skill library find_skills and read_skill; the index files as resources.

    Over HTTP, requests must carry `Authorization: Bearer $KINDEX_API_TOKEN`; without that variable the server
    listens on loopback only and answers only requests whose Host and Origin are this machine. Needs
    kindex[mcp].

    \b
    Examples:
      kindex mcp sample_kb                                  stdio, for a client that starts it
      kindex mcp --kb-root /srv/agents --http --port 8766   every agent, over HTTP
    """
    if (kb is None) == (kb_root is None):
        raise UsageError("give a KB, or --kb-root for a folder of agents' KBs")
    try:
        import uvicorn

        from kindex.mcpserver import Library, build_server, http_app
    except ImportError as exc:
        raise missing_extra("the MCP server", "mcp", exc) from None
    # stdout is the protocol over stdio: every log line goes to stderr, one per line.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="kindex-mcp %(levelname)s %(message)s")
    server = build_server(Library(kb=kb, kb_root=kb_root))
    if not use_http:
        server.run("stdio")
        return
    app = http_app(server, token=os.environ.get("KINDEX_API_TOKEN") or None, host=host, port=port)
    click.echo(f"kindex: MCP over HTTP at http://{host}:{port}/mcp", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
