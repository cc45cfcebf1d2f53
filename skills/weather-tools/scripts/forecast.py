#!/usr/bin/env python3
"""Print a deterministic fake weather forecast for CITY as JSON (standard library only)."""
import datetime
import hashlib
import json
import sys

USAGE = "usage: forecast.py CITY [DAYS]   (DAYS: integer 1-7, default 3)"
CONDITIONS = ["sunny", "partly cloudy", "cloudy", "light rain", "rain", "windy", "fog"]
START = datetime.date(2024, 1, 1)  # fixed so the output is reproducible


def main(argv):
    if not 1 <= len(argv) <= 2 or not argv[0].strip():
        print(USAGE, file=sys.stderr)
        return 2
    city = argv[0].strip()
    try:
        days = int(argv[1]) if len(argv) == 2 else 3
    except ValueError:
        days = 0
    if not 1 <= days <= 7:
        print(USAGE, file=sys.stderr)
        return 2
    seed = hashlib.sha256(city.lower().encode("utf-8")).digest()
    forecast = []
    for i in range(days):
        b = seed[i * 4 : i * 4 + 4]
        low = b[0] % 25 - 5
        forecast.append({
            "date": (START + datetime.timedelta(days=i)).isoformat(),
            "high": low + 3 + b[1] % 10,
            "low": low,
            "condition": CONDITIONS[b[2] % len(CONDITIONS)],
            "chance_of_rain": b[3] % 101,
        })
    print(json.dumps({"city": city, "unit": "celsius", "days": days, "forecast": forecast,
                      "note": "fake data for testing"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
