"""A Live session's delegations: the judge, the backend, the flow between them."""
