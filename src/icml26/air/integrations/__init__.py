"""AIR's sixth layer, integrations: AIR in agent frameworks, each behind its own extra and imported only when used.

LangChain middleware (``air.integrations.langchain``: one episode per run), an MCP proxy
(``air.integrations.mcp``, with a small demo server and its tool manifest for the tests), tool manifests read from
TOML or JSON files (``air.policy.manifest_file``, framework-free) and AgentDojo pipeline elements
(``air.integrations.agentdojo``: the adapter only, whose loop finishes each task run's episode; the AgentDojo
evaluation protocol is in the worlds layer, ``air.worlds.agentdojo``). They import the runtime and the
layers below it, never the worlds or the experiment.
"""
