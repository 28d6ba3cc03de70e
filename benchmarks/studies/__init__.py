"""Method comparisons and reproductions with their JSON / Markdown results."""
