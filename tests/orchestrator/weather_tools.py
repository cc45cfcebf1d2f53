"""The weather tools the guides register by name (one module, so each name is registered once per process)."""

from __future__ import annotations

from orchestrator.tools import register_tool


@register_tool("get_current_weather")
def get_current_weather(city: str, unit: str = "celsius") -> dict:
    """Get the current weather information for a specified city."""
    return {"city": city, "temperature": 22 if unit == "celsius" else 72, "unit": unit, "condition": "Partly Cloudy"}


@register_tool("get_weather_forecast")
def get_weather_forecast(city: str, days: int = 3) -> dict:
    """Get the weather forecast for a specified city."""
    return {"city": city, "forecast_days": [{"temperature": 22} for _ in range(days)]}


@register_tool("search_city_by_name")
def search_city_by_name(name: str) -> dict:
    """Search for city information by city name."""
    return {"name": name, "country": "China" if name == "Beijing" else "Unknown"}


def ask_name_information(name: str, country: str = "China") -> dict:
    """Ask for a person's name information (not declared by any skill)."""
    return {"name": name, "country": country}
