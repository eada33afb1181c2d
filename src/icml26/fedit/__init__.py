"""FedIT: federated independence testing under client heterogeneity.

Paper: "Powerful and Theoretically Guaranteed Independence Testing on Heterogeneous Federated Clients", ICML 2026 (poster 62361). https://icml.cc/virtual/2026/poster/62361

A federated HSIC independence test that stays valid when client marginals differ: a copula (rank) transform
inside each client aligns the marginals, and a stacked, within-client-only aggregation keeps the dependence
each client sees; gamma and permutation nulls, a random-feature acceleration and a differentially private
mode.

Status: planned — not implemented yet (issue #6). ``icml26 info fedit`` shows the card and its claims.
"""
