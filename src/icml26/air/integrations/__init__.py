"""AIR's sixth layer, integrations: AIR in agent frameworks, each behind its own extra and imported only when used.

LangChain middleware (``air.integrations.langchain``), an MCP proxy (``air.integrations.mcp``, with a small demo
server for its tests) and an AgentDojo pipeline element (``air.integrations.agentdojo``: the adapter only; the
AgentDojo evaluation protocol is in the worlds layer, ``air.worlds.agentdojo``). They import the runtime and the
layers below it, never the worlds or the experiment.
"""
