"""Hook points, plugins and their discovery, dispatch in one call order, the runner Protocol
plugins see."""
