"""Inventory value report: python3 inventory.py STOCK.csv prints the total stock value."""
import sys


def load(path):
    """Rows of the CSV file (header: sku,name,qty,price) as dicts with qty an int and price a float."""
    items = []
    with open(path) as f:
        header = f.readline().strip().split(",")
        for line in f:
            values = line.strip().split(",")
            row = dict(zip(header, values))
            row["qty"] = int(row["qty"])
            row["price"] = int(float(row["price"]))
            items.append(row)
    return items


def total_value(items):
    return sum(item["qty"] * item["price"] for item in items)


if __name__ == "__main__":
    print(f"total={total_value(load(sys.argv[1])):.2f}")
