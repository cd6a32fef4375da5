"""Inputs of the embedding references and tests."""

from __future__ import annotations

#: 20 varied texts for decoder pooling on SmolLM2: lengths from one word to
#: a paragraph, code, numbers, non-Latin scripts, markup, odd spacing.
DECODER_TEXTS: tuple[str, ...] = (
    "Hello",
    "The capital of France is Paris.",
    "def add(a, b):\n    return a + b\n",
    "Quantum entanglement links the states of two particles across any distance.",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "Le chat dort sur le canapé depuis ce matin.",
    "東京は日本の首都です。",
    "<html><body><p>Hi there</p></body></html>",
    "   leading and trailing spaces   ",
    "What is the best way to learn a new language quickly?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "I can't believe it's already November!",
    "The mitochondria is the powerhouse of the cell.",
    "Ein kleines Haus am See, umgeben von hohen Bäumen.",
    "🙂🚀✨ emoji in the middle 🎉 of text",
    "A long sentence that keeps going, with commas, clauses and asides, "
    "to check that mean pooling over many positions agrees with llama.cpp.",
    "e = mc^2",
    "Tabs\tand\nnewlines\n\nmixed in",
    "Once upon a time, in a land far away, there lived a curious fox.",
)

#: 50 sentences for MiniLM against llama.cpp and the float64 oracle.
SENTENCES: tuple[str, ...] = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "The new movie is so great.",
    "A dog is running through the grass.",
    "How do I reset my password?",
    "What is the weather like in Berlin today?",
    "Python is a popular programming language.",
    "The stock market fell sharply on Monday.",
    "She plays the piano beautifully.",
    "Machine learning models need lots of data.",
    "The Eiffel Tower is in Paris.",
    "I love hiking in the mountains during autumn.",
    "Can you recommend a good book?",
    "The restaurant was closed for renovation.",
    "Water boils at 100 degrees Celsius at sea level.",
    "He forgot his umbrella and got soaked.",
    "Unbelievably, the tokenization handles long words.",
    "The café's naïve résumé costs $3.50.",
    "Quick brown foxes jump over lazy dogs.",
    "Please turn off the lights when you leave.",
    "Electric cars are becoming more affordable.",
    "The meeting has been moved to Thursday afternoon.",
    "Children were playing football in the park.",
    "My phone battery dies too quickly.",
    "Vaccines train the immune system to recognize viruses.",
    "The library opens at nine in the morning.",
    "An apple a day keeps the doctor away.",
    "The train to Munich is delayed by twenty minutes.",
    "Global temperatures have risen over the last century.",
    "She adopted a kitten from the shelter.",
    "The recipe calls for two cups of flour.",
    "Our team won the championship last year.",
    "Solar panels convert sunlight into electricity.",
    "The museum displays ancient Egyptian artifacts.",
    "Don't forget to water the plants!",
    "He is learning to speak Japanese: 日本語.",
    "The server returned a 404 error.",
    "Birds migrate south for the winter.",
    "A nice cup of tea fixes everything.",
    "The conference will be held online this year.",
    "Reading before bed helps me relax.",
)

#: (anchor, paraphrase, non-paraphrases): MiniLM must rank the paraphrase
#: above every non-paraphrase (including topical near misses).
RETRIEVAL: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "How do I reset my password?",
        "What are the steps to change my forgotten password?",
        ("How do I reset my router?", "My password is very long.", "The cat sits outside."),
    ),
    (
        "The movie was fantastic.",
        "I really enjoyed the film.",
        ("The movie theater was closed.", "The soup was cold.", "I watched TV yesterday."),
    ),
    (
        "How old are you?",
        "What is your age?",
        ("How are you?", "Where do you live?", "The building is very old."),
    ),
    (
        "The flight was cancelled because of the storm.",
        "Bad weather led to the cancellation of the flight.",
        ("The flight landed on time.", "The storm damaged several houses.", "I booked a hotel."),
    ),
    (
        "She bought a new car.",
        "She purchased a new vehicle.",
        ("She sold her old car.", "The car needs repairs.", "She bought new shoes."),
    ),
    (
        "The company reported record profits.",
        "The firm announced its highest earnings ever.",
        ("The company laid off workers.", "Profits are taxed.", "The record player is broken."),
    ),
    (
        "Where is the nearest train station?",
        "How can I get to the closest railway station?",
        ("When does the train leave?", "The station was renovated.", "I like trains."),
    ),
    (
        "The child is sleeping.",
        "The kid is asleep.",
        ("The child is awake and crying.", "The dog is sleeping.", "Sleep is important."),
    ),
)
