"""fastapi_json: FastAPI ``GET /`` -> ``{"message": "Hello, world!"}``."""

from fastapi import FastAPI

app = FastAPI()


@app.get("/")
async def root():
    return {"message": "Hello, world!"}
