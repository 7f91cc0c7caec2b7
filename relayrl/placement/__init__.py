"""Placement of the roles: everything in this process (`local`), or Ray actors in placement groups (`ray`)."""
