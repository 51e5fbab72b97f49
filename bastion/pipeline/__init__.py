"""The call pipeline: the seams it consumes, the catalog, pins, approvals, authority, and the
Gateway that composes them.

Read it bottom-up: `seams` (what a source and a ledger offer), `catalog` and `content` (what hosts list),
`pinning` and `approvals` (drift and held calls), `authority` and `views` (who may decide, what approvers see),
then `gateway` (every call through one pipeline).
"""
